"""Backend choice: Triton for CUDA tensors, the PyTorch reference twin for everything else.

``backend="triton"`` on CPU tensors runs the Triton interpreter, which is how the kernels are tested
without a GPU. Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *defined*, so the
Triton modules are imported lazily (only when a Triton launch is requested) and the variable must be
set before that first import.
"""

from __future__ import annotations

from typing import Literal

import torch

Backend = Literal["auto", "triton", "reference"]


def use_triton(backend: str, device: torch.device) -> bool:
    if backend == "auto":
        return device.type == "cuda"
    if backend in ("triton", "reference"):
        return backend == "triton"
    raise ValueError(f"backend must be 'auto', 'triton' or 'reference', got {backend!r}")


def ensure_launchable(kernel: object, device: torch.device) -> None:
    """Refuses, with the fix in the message, to launch a compiled kernel on CPU tensors."""
    if device.type == "cuda":
        return
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(kernel, InterpretedFunction):
        raise ValueError(
            f"Triton kernels need CUDA tensors (got {device}); to run them on the CPU set TRITON_INTERPRET=1 "
            "before folio.kernels first launches a Triton kernel in this process"
        )
