"""``paged_decode_attention``: one new query token per sequence against its paged context."""

from __future__ import annotations

import torch

from folio.kernels import decode_attention_cpu
from folio.kernels._backend import Backend, use_native, use_triton
from folio.kernels._checks import (
    check_gqa,
    check_kv_cache,
    check_paged_metadata,
    check_scale,
    check_tensor,
    check_window,
    require,
)
from folio.kernels.attention_reference import decode_attention_ref


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, *, max_context_len: int | None = None,
    num_splits: int | None = None, window: int | None = None, backend: Backend = "auto",
) -> torch.Tensor:
    """Attention of ``q[B, Hq, D]`` over each sequence's ``context_lens[b]`` cached tokens → ``[B, Hq, D]``.

    With a sliding ``window`` W only the last W of them are attended to (the query's own token included).

    ``max_context_len`` (optional, a host-side bound on ``context_lens``) lets the Triton path split long
    contexts finely without reading the lengths back from the GPU; without it the bound is the block
    tables' capacity. ``num_splits`` forces the split-K factor (tests, benchmarks). On the CPU, ``auto``
    runs the native kernel (float32/bfloat16, when built) and otherwise the PyTorch reference.
    """
    _, block_size, kv_heads, head_dim = check_kv_cache(k_cache, v_cache)
    device = k_cache.device
    q = check_tensor("q", q, ndim=3, dtypes=(k_cache.dtype,), device=device)
    batch, num_heads, q_dim = q.shape
    require(q_dim == head_dim, lambda: f"q head_dim {q_dim} does not match the cache's {head_dim}")
    check_gqa(num_heads, kv_heads)
    block_tables, context_lens = check_paged_metadata(block_tables, context_lens, batch, device)
    scale = check_scale(scale)
    capacity = block_tables.shape[1] * block_size
    if max_context_len is None:
        max_context_len = capacity
    require(0 <= max_context_len <= capacity,
            lambda: f"max_context_len {max_context_len} exceeds the block tables' capacity of {capacity} tokens")
    require(num_splits is None or num_splits >= 1, lambda: f"num_splits must be >= 1, got {num_splits}")
    window = check_window(window)
    if batch == 0:
        return torch.empty_like(q)
    native = not use_triton(backend, device) and use_native(
        backend, decode_attention_cpu.supports(q), f"{q.dtype} queries on {device}")
    if native:  # it checks the lengths itself, in a loop of its own (every layer of every step lands here)
        return decode_attention_cpu.decode_attention_cpu(q, k_cache, v_cache, block_tables, context_lens, scale,
                                                         window=window, max_context_len=max_context_len)
    if device.type == "cpu":
        # Value checks cost a device sync on CUDA, so there the caller's metadata is trusted.
        lo, hi = int(context_lens.min()), int(context_lens.max())
        require(lo >= 0 and hi <= max_context_len,
                lambda: f"context_lens must lie in [0, {max_context_len}], got [{lo}, {hi}]")
    if use_triton(backend, device):
        from folio.kernels.decode_attention_triton import decode_attention_triton

        return decode_attention_triton(q, k_cache, v_cache, block_tables, context_lens, scale,
                                       max_context_len=max_context_len, num_splits=num_splits, window=window)
    return decode_attention_ref(q, k_cache, v_cache, block_tables, context_lens, scale, window)
