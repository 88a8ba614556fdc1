"""The native CPU prefill attention (``kernels/csrc/prefill_attention_cpu.c``): one prompt segment's causal
attention over its contiguous keys and values, where the engine ran SDPA's CPU flash kernel.

Its reference is ``folio.kernels.attention_reference`` (through ``tests/kernels``); it matches it up to
summation order. Built by ``pip install`` as an optional C extension; ``AVAILABLE`` says whether this install
has it and this CPU runs it (AVX-512F or AVX2).
"""

from __future__ import annotations

import torch

from folio.kernels._checks import require
from folio.kernels.native import load_native

_cpu_prefill = load_native("_cpu_prefill")  # None without a C compiler: the engine keeps SDPA

AVAILABLE = _cpu_prefill is not None and bool(_cpu_prefill.available())
DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def supports(q: torch.Tensor) -> bool:
    """Whether the kernel runs queries like ``q [n, Hq, D]``: CPU, float32 or bfloat16, D a multiple of 16
    up to 256."""
    head_dim = q.shape[-1]
    return AVAILABLE and q.device.type == "cpu" and q.dtype in DTYPES and head_dim % 16 == 0 and head_dim <= 256


def _heads_contiguous(t: torch.Tensor) -> bool:
    return t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]


def prefill_attention_cpu(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, *, window: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of ``q [n, Hq, D]`` over ``k``/``v`` ``[L, Hkv, D]`` (L >= n): query i sits at
    position L - n + i and sees keys max(0, p - window + 1) .. p. Rows may lie any distance apart; each
    token's heads must be contiguous in k and v, and each head in q. Writes ``out`` (``[n, Hq, D]``, same
    layout rules as q) when given, else a new tensor; returns it."""
    assert _cpu_prefill is not None, "folio.kernels._cpu_prefill was not built"
    require(supports(q) and q.dim() == 3 and q.stride(2) == 1,
            lambda: f"q must be [n, heads, head_dim] on the CPU in {sorted(map(str, DTYPES))} with head_dim a "
                    f"multiple of 16 up to 256, got {q.dtype} {tuple(q.shape)} on {q.device}")
    n, heads, head_dim = q.shape
    require(_heads_contiguous(k) and _heads_contiguous(v) and k.shape == v.shape and k.shape[2] == head_dim
            and k.dtype == v.dtype == q.dtype and k.device == v.device == q.device,
            lambda: f"k {tuple(k.shape)} and v {tuple(v.shape)} must be [L, kv_heads, {head_dim}] in q's dtype, "
                    f"each token's heads contiguous")
    length, kv_heads = k.shape[0], k.shape[1]
    require(length >= n and heads % kv_heads == 0,
            lambda: f"{n} queries over {length} keys with {heads} heads over {kv_heads} KV heads")
    require(window is None or window > 0, "window must be positive")
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    require(out.shape == q.shape and out.dtype == q.dtype and out.stride(2) == 1 and out.device == q.device,
            lambda: f"out must be {tuple(q.shape)} in {q.dtype} with contiguous heads")
    _cpu_prefill.prefill(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), n, length, heads, kv_heads, head_dim, window or 0,
        q.stride(0), q.stride(1), k.stride(0), v.stride(0), out.stride(0), out.stride(1), scale, DTYPES[q.dtype],
        torch.get_num_threads(),
    )
    return out
