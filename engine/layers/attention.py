"""Paged attention: store this step's K/V in the block cache, then attend over each sequence's context.

CPU: prefill segments run one by one through `folio.kernels`' native CPU prefill kernel where the CPU has
AVX-512 or AVX2, else `scaled_dot_product_attention` (either directly on the new K/V when nothing is cached before
them); decode queries run through `folio.kernels`' native CPU kernel, which reads
the paged cache in place, or (a build without it, or float16) in a few length buckets over K/V gathered by
block table. Grouped-query attention needs no K/V copies for decodes: the query heads sharing a KV head are
folded into that head's query rows. CUDA: the `folio.kernels` paged kernels.

A sliding ``window`` W (a layer's, None for full attention) limits the query at position p to the keys at
p - W + 1 .. p on every path: prefill segments read only the keys some query of theirs can see and mask
the rest (one mask per segment and window, shared by the layers), decodes pass the window to the kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from folio.engine.layers.context import AttentionContext, PrefillSegment
from folio.kernels import fused_cpu, prefill_attention_cpu
from folio.kernels.decode_attention import paged_decode_attention
from folio.kernels.kv_store import store_kvcache
from folio.kernels.prefill_attention import paged_prefill_attention


def paged_attention(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    ctx: AttentionContext,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    if ctx.use_kernels:
        return _kernel_attention(q, k, v, k_cache, v_cache, ctx, scale, window)
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    if fused_cpu.can_store(k, v):
        fused_cpu.store_kv(k, v, k_cache, v_cache, ctx.slot_mapping)
    else:
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, ctx.slot_mapping, k)
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, ctx.slot_mapping, v)
    if not ctx.prefills and ctx.decode_block_tables is not None:  # decodes only: the kernel's output is all
        return paged_decode_attention(
            q, k_cache, v_cache, ctx.decode_block_tables, ctx.decode_context_lens, scale, window=window
        )
    out = torch.empty_like(q)
    if ctx.prefills and prefill_attention_cpu.supports(q):
        _native_prefill(q, k, v, k_cache, v_cache, ctx, scale, window, out)
    else:
        _sdpa_prefill(q, k, v, k_cache, v_cache, ctx, scale, window, out)
    if ctx.decode_block_tables is not None:
        first = ctx.num_prefill_tokens
        out[first:] = paged_decode_attention(
            q[first:], k_cache, v_cache, ctx.decode_block_tables, ctx.decode_context_lens, scale, window=window
        )
    if ctx.decode_buckets:
        assert ctx.gather_buffers is not None
        k_buf, v_buf = ctx.gather_buffers
        for bucket in ctx.decode_buckets:
            b, n = bucket.end - bucket.start, bucket.flat_blocks.numel()
            # Gathering into a persistent buffer: a fresh tensor this size would page-fault on every layer.
            kd = torch.index_select(k_cache, 0, bucket.flat_blocks, out=k_buf[:n])
            vd = torch.index_select(v_cache, 0, bucket.flat_blocks, out=v_buf[:n])
            kd = kd.view(b, -1, num_kv_heads, head_dim).transpose(1, 2)  # [B, Hkv, L, D]
            vd = vd.view(b, -1, num_kv_heads, head_dim).transpose(1, 2)
            qd = q[bucket.start : bucket.end].view(b, num_kv_heads, -1, head_dim)  # [B, Hkv, G, D]
            o = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=bucket.window_mask(window), scale=scale)
            out[bucket.start : bucket.end] = o.reshape(b, -1, head_dim)
    return out


def _native_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    ctx: AttentionContext, scale: float, window: int | None, out: torch.Tensor,
) -> None:
    """Each segment through the native kernel, straight from this step's K/V when nothing is cached before
    them; else over its context from the first key any of its queries sees (positions shift alike, so the
    window's arithmetic holds)."""
    for seg in ctx.prefills:
        if seg.block_table is None:
            ks, vs = k[seg.start : seg.end], v[seg.start : seg.end]
        else:
            first = _first_visible_key(seg, window)
            ks = k_cache[seg.block_table].flatten(0, 1)[first : seg.context_len]
            vs = v_cache[seg.block_table].flatten(0, 1)[first : seg.context_len]
        prefill_attention_cpu.prefill_attention_cpu(q[seg.start : seg.end], ks, vs, scale, window=window,
                                                    out=out[seg.start : seg.end])


def _sdpa_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    ctx: AttentionContext, scale: float, window: int | None, out: torch.Tensor,
) -> None:
    num_kv_heads = k.shape[1]
    gqa = q.shape[1] != num_kv_heads
    for seg in ctx.prefills:
        qs = q[seg.start : seg.end].transpose(0, 1)  # [Hq, L, D]
        n = seg.end - seg.start
        first = _first_visible_key(seg, window)
        if seg.block_table is None and (window is None or window >= n):
            ks, vs = k[seg.start : seg.end], v[seg.start : seg.end]
            mask, causal = None, True
        else:
            if seg.block_table is None:  # the whole context is this step's, but a window cuts into it
                ks, vs = k[seg.start + first : seg.end], v[seg.start + first : seg.end]
            else:
                ks = k_cache[seg.block_table].flatten(0, 1)[first : seg.context_len]
                vs = v_cache[seg.block_table].flatten(0, 1)[first : seg.context_len]
            mask, causal = _prefill_mask(seg, first, window), False
        if gqa:  # repeated K/V keep SDPA on its flash kernel (enable_gqa falls back to the math one)
            ks = ks.repeat_interleave(q.shape[1] // num_kv_heads, dim=1)
            vs = vs.repeat_interleave(q.shape[1] // num_kv_heads, dim=1)
        # 4-D inputs: SDPA's CPU flash kernel only takes batched ones (3-D falls back to the math kernel)
        o = F.scaled_dot_product_attention(
            qs[None], ks.transpose(0, 1)[None], vs.transpose(0, 1)[None], attn_mask=mask, is_causal=causal,
            scale=scale,
        )
        out[seg.start : seg.end] = o[0].transpose(0, 1)


def _kernel_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    ctx: AttentionContext,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    store_kvcache(k, v, k_cache, v_cache, ctx.slot_mapping)
    if ctx.prefills:
        # Decode rows (after the prefill chunks) go to the decode kernel: in the prefill kernel's query tile
        # a one-token query fills GROUP of its 128 rows, with no split-K.
        p, t = len(ctx.prefills), ctx.num_prefill_tokens
        assert ctx.block_tables is not None and ctx.context_lens is not None and ctx.cu_seqlens_q is not None
        prefill = paged_prefill_attention(
            q[:t], k_cache, v_cache, ctx.cu_seqlens_q[: p + 1], ctx.context_lens[:p], ctx.block_tables[:p], scale,
            window=window,
        )
        if t == q.shape[0]:
            return prefill
        out = torch.empty_like(q)
        out[:t] = prefill
        out[t:] = paged_decode_attention(
            q[t:], k_cache, v_cache, ctx.block_tables[p:], ctx.context_lens[p:], scale,
            max_context_len=ctx.max_context_len, window=window,
        )
        return out
    return paged_decode_attention(
        q, k_cache, v_cache, ctx.block_tables, ctx.context_lens, scale, max_context_len=ctx.max_context_len,
        window=window,
    )


def _first_visible_key(seg: PrefillSegment, window: int | None) -> int:
    """The first position any query of the segment sees (its first query's window start)."""
    first_query = seg.context_len - (seg.end - seg.start)
    return 0 if window is None else max(0, first_query - window + 1)


def _prefill_mask(seg: PrefillSegment, first: int, window: int | None) -> torch.Tensor:
    """[queries, keys first..context_len) bool: causal, and within the window. Built once per step for each
    window (the layers share it)."""
    mask = seg.masks.get(window)
    if mask is None:
        n = seg.end - seg.start
        # query i sits at position context_len - n + i and sees keys up to there
        q_pos = torch.arange(seg.context_len - n, seg.context_len).unsqueeze(1)
        k_pos = torch.arange(first, seg.context_len).unsqueeze(0)
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
        seg.masks[window] = mask
    return mask
