"""Model building blocks. CPU tensors use the PyTorch code here; CUDA tensors go through `folio.kernels`."""
