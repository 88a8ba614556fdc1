"""Projections ``x @ weight.T + bias``: `F.linear`, except on the CPU, where weights prepacked for oneDNN go to
oneDNN's matmul directly.

`F.linear`'s float32 CPU GEMM is MKL's, and MKL chooses its kernels by CPU vendor: on the AMD EPYC
development machine (AVX-512) it stays well below what oneDNN reaches on the same core. oneDNN (bundled
with torch as mkldnn) dispatches on the instruction set itself and multiplies 1.7-2.2x faster there at
decode batches (32, 64) and prefill chunks, for the decoder projections and the LM head, about even at
batch 1 (`bench/cpu_paths.py`, bench/README.md); its results differ from MKL's only in rounding
(summation order). The engine hands it weights prepacked into oneDNN's blocked layout once at start-up
(`pack_for_onednn`), which saves the per-call re-layout: 1.46-1.86x per projection at decode batches of
8-17, 1.13x at 64, 1.06-1.09x on prefill chunks (bench/cpu_paths.py).

Decode steps of a few rows are bound by reading the weights, not by the multiplies: there each prepacked
weight carries a second copy in `folio.kernels.decode_gemm_cpu`'s panels (`add_decode_panels`), whose
kernel streams them at 1.3-1.8x oneDNN's rate up to 12 rows in float32 (1.03-1.25x at 16-64, where it is
bound by the multiplies as much) and 1.1-1.45x up to 64 in bfloat16 on AVX512-BF16's dot products
(bench/decode_gemm.py), at the cost of holding the projections twice.

bfloat16: `F.linear` already runs oneDNN's matmul on a CPU with bfloat16 instructions (AVX-512 BF16, AMX),
but re-lays-out the weight on every call; prepacked, the same GEMM gives bit-identical results without
that cost (bench/cpu_paths.py compares the two). Where the CPU lacks those instructions bfloat16 weights
stay as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from folio.kernels import decode_gemm_cpu

ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
ONEDNN_BF16 = ONEDNN and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def uses_onednn(x: torch.Tensor) -> bool:
    return ONEDNN and x.device.type == "cpu" and x.dtype == torch.float32


# The batch size oneDNN blocks the packed weights for: as fast as a hint of 64 from batch 8 up, and
# better than it on prefill chunks; below 8 tokens packing neither helps nor hurts.
PACK_BATCH_HINT = 256


def packs(dtype: torch.dtype) -> bool:
    """Whether CPU weights of this dtype are prepacked for oneDNN."""
    return (dtype == torch.float32 and ONEDNN) or (dtype == torch.bfloat16 and ONEDNN_BF16)


def pack_for_onednn(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] in oneDNN's blocked layout (an opaque mkldnn tensor that only `linear` reads); the
    inputs it multiplies must have its dtype."""
    assert packs(weight.dtype) and weight.dim() == 2 and weight.device.type == "cpu"
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_BATCH_HINT)


# Whether `add_decode_panels` adds the panels (bench/throughput.py's folio-no-panels phase turns it off).
DECODE_PANELS = True


def add_decode_panels(packed: torch.Tensor, weight: torch.Tensor) -> None:
    """Gives the prepacked ``packed`` the decode kernel's panels of ``weight`` (row-major [out, in]), where
    this CPU runs the kernel."""
    if DECODE_PANELS and decode_gemm_cpu.AVAILABLE and weight.dtype in decode_gemm_cpu.DTYPES:
        packed.decode_panels = decode_gemm_cpu.pack(weight)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    panels = getattr(weight, "decode_panels", None)
    if panels is not None and decode_gemm_cpu.faster(x, panels):
        return decode_gemm_cpu.decode_gemm(x, panels, bias)
    if weight.is_mkldnn or (uses_onednn(x) and weight.dtype == torch.float32):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
