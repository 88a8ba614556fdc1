"""Projections ``x @ weight.T + bias``: `F.linear`, except float32 on the CPU, which goes to oneDNN's matmul.

`F.linear`'s float32 CPU GEMM is MKL's, and MKL chooses its kernels by CPU vendor: on the AMD EPYC
development machine (AVX-512) it stays well below what oneDNN reaches on the same core. oneDNN (bundled
with torch as mkldnn) dispatches on the instruction set itself and multiplies 1.7-2.2x faster there at
decode batches (32, 64) and prefill chunks, for the decoder projections and the LM head, about even at
batch 1 (`bench/cpu_paths.py`, bench/README.md); its results differ from MKL's only in rounding
(summation order). It reads the same row-major [out, in] weight, so nothing is copied or re-laid-out.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def uses_onednn(x: torch.Tensor) -> bool:
    return ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if uses_onednn(x) and weight.dtype == torch.float32:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
