"""Projections ``x @ weight.T + bias``: `F.linear`, except float32 on the CPU, which goes to oneDNN's matmul.

`F.linear`'s float32 CPU GEMM is MKL's, and MKL picks its kernels by CPU vendor: on AMD CPUs it runs its AVX2
code even where the CPU has AVX-512. oneDNN (bundled with torch as mkldnn) dispatches on the instruction set
itself. On the 2-core AMD EPYC development machine (AVX-512) it multiplies 1.7-2.2x faster at every shape the
engine runs, decode batches and prefill chunks alike, for the decoder projections and the LM head
(`bench/cpu_paths.py`), and its results differ from MKL's only in rounding (summation order). It reads the
same row-major [out, in] weight, so nothing is copied or re-laid-out.
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
