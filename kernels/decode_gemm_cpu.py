"""The CPU projections of decode steps with few rows (``kernels/csrc/decode_gemm_cpu.c``): ``x @ weight.T (+ bias)``
for ``x`` of 1 to `MAX_ROWS` rows, reading the weights in panels of their own (`pack`) at the memory bandwidth
a step of that size is bound by. Its PyTorch twin, which the tests compare it with, is `decode_gemm_ref`.

Built by ``pip install`` as an optional C extension; `AVAILABLE` says whether this install has it and this
CPU runs it (AVX-512F). Float32 and bfloat16 CPU tensors; ``x``'s rows contiguous.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from folio.kernels._checks import require
from folio.kernels.native import load_native

_cpu_decode_gemm = load_native("_cpu_decode_gemm")  # None without a C compiler: callers keep oneDNN

AVAILABLE = _cpu_decode_gemm is not None and bool(_cpu_decode_gemm.available())
DTYPES = {torch.float32: 0, torch.bfloat16: 1}
PANEL = 16  # weight rows per panel: one AVX-512 vector of float32 outputs
MAX_ROWS = 64  # the most rows the kernel takes
# Up to how many rows it beats oneDNN (bench/decode_gemm.py, two cores of the Zen 4 development machine): in
# float32 1.8x at 1-2 rows, 1.3-1.5x at 4-12, 1.1-1.3x at 16-48, 1.03x at 64; bfloat16 on AVX512-BF16's dot
# products 1.4x at 1-2 rows, 1.2-1.35x at 4-48, 1.1x at 64 (widened to float32 instead, as before the dot
# products, it lost to oneDNN's from 4 rows).
FASTER_UP_TO = {torch.float32: 64, torch.bfloat16: 64}


class Panels:
    """A weight ``[N, K]`` laid out for the kernel, rows past N zero: float32 ``[ceil(N / 16), K, 16]``;
    bfloat16 in pairs of K, ``[ceil(N / 16), ceil(K / 2), 16, 2]`` (k past K zero), the operand order of
    AVX512-BF16's dot products. Either way one 64-byte step of a panel per k (float32) or pair of k."""

    def __init__(self, weight: torch.Tensor) -> None:
        require(weight.dim() == 2 and weight.dtype in DTYPES and weight.device.type == "cpu",
                lambda: f"weight must be a 2-D float32 or bfloat16 CPU tensor, got {weight.dtype} "
                        f"{tuple(weight.shape)} on {weight.device}")
        self.out_features, self.in_features = weight.shape
        pairs = weight.dtype == torch.bfloat16
        padded = F.pad(weight.detach(), (0, self.in_features % 2 if pairs else 0, 0, -self.out_features % PANEL))
        if pairs:
            self.data = padded.reshape(-1, PANEL, padded.shape[1] // 2, 2).permute(0, 2, 1, 3).contiguous()
        else:
            self.data = padded.reshape(-1, PANEL, self.in_features).transpose(1, 2).contiguous()
        self.dtype = weight.dtype


def pack(weight: torch.Tensor) -> Panels:
    return Panels(weight)


def supports(x: torch.Tensor, panels: Panels) -> bool:
    """Whether `decode_gemm` takes ``x``: built, a CPU tensor of 1 to `MAX_ROWS` rows in the panels' dtype."""
    return (AVAILABLE and x.dim() == 2 and 1 <= x.shape[0] <= MAX_ROWS and x.dtype == panels.dtype
            and x.device.type == "cpu")


def faster(x: torch.Tensor, panels: Panels) -> bool:
    """Whether `decode_gemm` takes ``x`` and runs it faster than oneDNN (`FASTER_UP_TO`)."""
    return supports(x, panels) and x.shape[0] <= FASTER_UP_TO[x.dtype]


def decode_gemm(x: torch.Tensor, panels: Panels, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x[M, K] @ weight.T + bias`` → ``[M, N]`` in x's dtype, M ≤ `MAX_ROWS`."""
    assert _cpu_decode_gemm is not None, "folio.kernels._cpu_decode_gemm was not built"
    require(supports(x, panels) and x.shape[1] == panels.in_features and x.stride(1) == 1,
            lambda: f"x must be [1-{MAX_ROWS}, {panels.in_features}] {panels.dtype} CPU rows with a unit last "
                    f"stride, got {x.dtype} {tuple(x.shape)} strides {x.stride()} on {x.device}")
    if bias is not None:
        require(bias.shape == (panels.out_features,) and bias.dtype == x.dtype and bias.is_contiguous(),
                lambda: f"bias must be contiguous [{panels.out_features}] in x's dtype, got {bias.dtype} "
                        f"{tuple(bias.shape)}")
    out = torch.empty((x.shape[0], panels.out_features), dtype=x.dtype)
    _cpu_decode_gemm.gemm(x.data_ptr(), x.stride(0), panels.data.data_ptr(), 0 if bias is None else bias.data_ptr(),
                          out.data_ptr(), x.shape[0], panels.out_features, panels.in_features, DTYPES[x.dtype],
                          torch.get_num_threads())
    return out


def bf16_dot(on: bool | None = None) -> bool:
    """Whether bfloat16 runs on AVX512-BF16's dot products (where the CPU has them) rather than widened to
    float32; ``False`` turns them off for this process, ``True`` back to what the CPU has (the tests run both)."""
    assert _cpu_decode_gemm is not None, "folio.kernels._cpu_decode_gemm was not built"
    return bool(_cpu_decode_gemm.bf16_dot(-1 if on is None else int(on)))


def decode_gemm_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same product in float32 (rounded to x's dtype once): what the kernel computes up to summation order."""
    out = x.float() @ weight.float().T
    if bias is not None:
        out += bias.float()
    return out.to(x.dtype)
