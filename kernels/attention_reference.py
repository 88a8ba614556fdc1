"""Vectorized PyTorch references for paged attention: the correctness oracle and the CPU path.

Both compute in float32 and return the query's dtype. Query head ``h`` reads KV head
``h // (num_heads // num_kv_heads)`` (grouped-query attention). With a sliding ``window`` W, the query at
position ``p`` sees the keys at positions ``p - W + 1 .. p`` only (its last W tokens, itself included), as
`transformers`' sliding-window masks define it.
"""

from __future__ import annotations

import torch

from folio.kernels.layout import gather_sequence_kv


def _grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[..., heads, D]`` → ``[..., kv_heads, group, D]``: the query heads that share each KV head."""
    return x.unflatten(-2, (kv_heads, x.shape[-2] // kv_heads))


def decode_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, window: int | None = None,
) -> torch.Tensor:
    """One query per sequence over its context (its last ``window`` tokens with a window), the batch
    gathered at once (padded to the longest)."""
    batch, _, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros_like(q)
    if batch == 0:
        return out
    max_len = int(context_lens.max())
    if max_len == 0:
        return out
    pos = torch.arange(max_len, device=q.device)
    valid = pos[None, :] < context_lens[:, None].long()                                # [B, L]
    if window is not None:
        valid &= pos[None, :] >= context_lens[:, None].long() - window
    pages = block_tables[:, : (max_len + block_size - 1) // block_size].long()
    pages = pages.gather(1, (pos // block_size).expand(batch, -1))
    slots = torch.where(valid, pages * block_size + pos % block_size, 0)               # [B, L]
    k = k_cache.view(-1, kv_heads, head_dim)[slots].float()                           # [B, L, Hkv, D]
    v = v_cache.view(-1, kv_heads, head_dim)[slots].float()
    qg = _grouped(q.float(), kv_heads)                                                 # [B, Hkv, G, D]
    scores = torch.einsum("bhgd,blhd->bhgl", qg, k) * scale
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # an empty context gives zeros, not NaN
    out = torch.einsum("bhgl,blhd->bhgd", probs, v).flatten(1, 2)
    return out.to(q.dtype)


def prefill_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, window: int | None = None,
) -> torch.Tensor:
    """Packed queries, each sequence's block the last positions of its context, attending causally (and
    within the last ``window`` positions, with a window)."""
    kv_heads = k_cache.shape[2]
    out = torch.zeros_like(q)
    bounds = cu_seqlens_q.tolist()
    for b, ctx in enumerate(context_lens.tolist()):  # one dense causal block per sequence
        q_lo, q_hi = bounds[b], bounds[b + 1]
        if q_hi == q_lo:
            continue
        k = gather_sequence_kv(k_cache, block_tables[b], ctx).float()                  # [L, Hkv, D]
        v = gather_sequence_kv(v_cache, block_tables[b], ctx).float()
        qg = _grouped(q[q_lo:q_hi].float(), kv_heads)                                  # [Tq, Hkv, G, D]
        scores = torch.einsum("qhgd,lhd->hgql", qg, k) * scale
        q_pos = torch.arange(ctx - (q_hi - q_lo), ctx, device=q.device)
        k_pos = torch.arange(ctx, device=q.device)[None, :]
        hidden = k_pos > q_pos[:, None]                                                 # [Tq, L]
        if window is not None:
            hidden |= k_pos <= q_pos[:, None] - window
        probs = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
        out[q_lo:q_hi] = torch.einsum("hgql,lhd->qhgd", probs, v).flatten(1, 2).to(q.dtype)
    return out
