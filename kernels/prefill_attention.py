"""``paged_prefill_attention``: packed variable-length queries over their paged context, causally.

Sequence ``b`` owns queries ``q[cu_seqlens_q[b]:cu_seqlens_q[b+1]]``: the last positions of its
``context_lens[b]`` tokens, whose K/V are already in the cache. The cached prefix before them may come
from an earlier chunk (chunked prefill) or from a prefix-cache hit; a query length of 1 is a decode. With
a sliding ``window`` W, the query at position p sees the keys at p - W + 1 .. p only.
"""

from __future__ import annotations

import torch

from folio.kernels._backend import Backend, use_triton
from folio.kernels._checks import (
    check_gqa,
    check_kv_cache,
    check_paged_metadata,
    check_scale,
    check_tensor,
    check_window,
    require,
)
from folio.kernels.attention_reference import prefill_attention_ref


def _check_lengths(cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, num_tokens: int,
                   capacity: int) -> None:
    """Value checks (CPU only: on CUDA they would cost a device sync per layer)."""
    bounds = cu_seqlens_q.tolist()
    require(bounds[0] == 0 and bounds[-1] == num_tokens,
            lambda: f"cu_seqlens_q must run from 0 to the {num_tokens} packed query tokens, got {bounds[0]}..{bounds[-1]}")
    for b, ctx in enumerate(context_lens.tolist()):
        q_len = bounds[b + 1] - bounds[b]
        if q_len < 0:
            raise ValueError(f"cu_seqlens_q must be non-decreasing, got {bounds[b]} then {bounds[b + 1]}")
        if not q_len <= ctx <= capacity:
            raise ValueError(f"sequence {b}: needs {q_len} <= context_lens ({ctx}) <= block-table capacity "
                             f"({capacity})")


def paged_prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, *, window: int | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Causal attention of the packed ``q[T, Hq, D]`` over each sequence's paged context → ``[T, Hq, D]``."""
    _, block_size, kv_heads, head_dim = check_kv_cache(k_cache, v_cache)
    device = k_cache.device
    q = check_tensor("q", q, ndim=3, dtypes=(k_cache.dtype,), device=device)
    num_tokens, num_heads, q_dim = q.shape
    require(q_dim == head_dim, lambda: f"q head_dim {q_dim} does not match the cache's {head_dim}")
    check_gqa(num_heads, kv_heads)
    cu_seqlens_q = check_tensor("cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=(torch.int32,), device=device,
                                unit_last_stride=False)
    require(cu_seqlens_q.shape[0] >= 1, "cu_seqlens_q needs batch + 1 entries, got none")
    batch = cu_seqlens_q.shape[0] - 1
    block_tables, context_lens = check_paged_metadata(block_tables, context_lens, batch, device)
    scale = check_scale(scale)
    window = check_window(window)
    if device.type == "cpu":
        _check_lengths(cu_seqlens_q, context_lens, num_tokens, block_tables.shape[1] * block_size)
    if num_tokens == 0 or batch == 0:
        return torch.zeros_like(q)
    if use_triton(backend, device):
        from folio.kernels.prefill_attention_triton import prefill_attention_triton

        return prefill_attention_triton(q, k_cache, v_cache, cu_seqlens_q, context_lens, block_tables, scale,
                                        window=window)
    return prefill_attention_ref(q, k_cache, v_cache, cu_seqlens_q, context_lens, block_tables, scale, window)
