"""Triton paged prefill/extend attention over packed variable-length queries (also handles decode).

Grid ``(num_q_tiles, kv_heads)``. A program owns ``BLOCK_Q`` consecutive query tokens of one
sequence and all ``GROUP`` query heads of its KV head, laid out as ``BLOCK_M = BLOCK_Q * GROUP``
rows, so each K/V tile read from the cache serves the whole group. Sequence ``b``'s tiles start at
program ``cu_seqlens_q[b] // BLOCK_Q + b``, an increasing function of ``b``: a program finds its
sequence by binary search, and ``T // BLOCK_Q + batch`` programs cover every tile without reading
lengths back to the host. Keys before the tile's first query need no causal mask; only the last
tiles up to the diagonal are masked. With a sliding window W (``window`` 0: none) the walk starts at the
tile holding the first row's first visible key, and the tiles below the last row's first visible key are
masked too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from folio.kernels._backend import ensure_launchable

LOG2E = 1.4426950408889634
BLOCK_M = 128   # query rows (token x head-in-group) per program
BLOCK_N = 64    # context tokens per tile


# The sequence count, window and block-table width change from step to step: specializing on them (value
# 1, divisibility by 16) would compile new variants as contexts grow.
@triton.jit(do_not_specialize=["num_seqs", "window", "stride_bt"])
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, cu_q_ptr, context_lens_ptr, block_tables_ptr,
    scale_log2, num_seqs, window,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_kb, stride_kt, stride_kh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)

    # The largest b with cu_q[b] // BLOCK_Q + b <= pid. lo/hi start as tensors (not Python ints) so
    # that the loop-carried types stay fixed.
    lo = pid * 0
    hi = lo + num_seqs
    while hi - lo > 1:
        mid = (lo + hi) // 2
        first_tile = tl.load(cu_q_ptr + mid) // BLOCK_Q + mid
        lo = tl.where(first_tile <= pid, mid, lo)
        hi = tl.where(first_tile <= pid, hi, mid)
    seq = lo
    q_start = tl.load(cu_q_ptr + seq)
    q_len = tl.load(cu_q_ptr + seq + 1) - q_start
    q_tile = pid - (q_start // BLOCK_Q + seq)
    if q_tile * BLOCK_Q >= q_len:
        return
    ctx = tl.load(context_lens_ptr + seq)
    prefix = ctx - q_len

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    tok = q_tile * BLOCK_Q + r // GROUP                    # query index within the sequence
    heads = kv_head * GROUP + r % GROUP
    r_mask = (r < BLOCK_Q * GROUP) & (tok < q_len)
    d_mask = d < HEAD_DIM
    q_rows = (q_start + tok).to(tl.int64) * stride_qt + heads * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=r_mask[:, None] & d_mask[None, :], other=0.0)
    q_pos = prefix + tok                                   # absolute position of each row's token

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    first_pos = prefix + q_tile * BLOCK_Q
    kv_end = tl.minimum(first_pos + BLOCK_Q, ctx)
    unmasked_end = (first_pos // BLOCK_N) * BLOCK_N        # every key below is visible to every row
    # with a window: keys below the first row's lower bound are visible to no row, keys below the last
    # row's lower bound not to every row
    kv_start = tl.where(window > 0, (tl.maximum(first_pos - window + 1, 0) // BLOCK_N) * BLOCK_N, 0)
    masked_below = tl.where(window > 0, kv_end - window, 0)

    for tile in range(kv_start, kv_end, BLOCK_N):
        pos = tile + n
        diagonal = (tile >= unmasked_end) | (tile < masked_below)
        valid = pos < kv_end
        page = tl.load(table + pos // PAGE, mask=valid, other=0).to(tl.int64)
        rows = page * stride_kb + (pos % PAGE) * stride_kt + kv_head * stride_kh
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2         # [M, N]
        if diagonal:
            visible = valid[None, :] & (pos[None, :] <= q_pos[:, None])
            if window > 0:
                visible = visible & (pos[None, :] > q_pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
        # Without a window every row sees key 0 of its first tile (even padding rows, whose q_pos >= ctx);
        # with one a row may see nothing in a tile yet: a zero reference keeps exp2 free of NaN.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # 0 only for padding rows, which are not stored
    o_rows = (q_start + tok).to(tl.int64) * stride_ot + heads * stride_oh
    tl.store(out_ptr + o_rows[:, None] + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=r_mask[:, None] & d_mask[None, :])


def prefill_attention_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor, block_tables: torch.Tensor, scale: float, *, window: int | None = None,
) -> torch.Tensor:
    """Launches on inputs checked by ``folio.kernels.prefill_attention.paged_prefill_attention``."""
    ensure_launchable(_prefill_kernel, q.device)
    num_tokens, num_heads, head_dim = q.shape
    _, page, kv_heads, _ = k_cache.shape
    batch = cu_seqlens_q.shape[0] - 1
    group = num_heads // kv_heads
    # float32 operands need half the tile: 128 x 64 spills at head_dim 128 (255 registers, 840 B) and, with
    # Triton 3.6's register allocation, at head_dim 64 too (56 B). head_dim 256 (Gemma 3) takes the half tile in
    # any dtype: the full one compiles for sm_90 to all 255 registers and 196 KB of its 227 KB of shared memory
    # (one program per SM, on the edge of spilling); the half one to 168 registers and 103 KB.
    small = q.dtype == torch.float32 or head_dim > 128
    block_m = max(BLOCK_M // 2 if small else BLOCK_M, triton.next_power_of_2(group))
    block_q = block_m // group
    out = torch.empty_like(q)
    grid = (num_tokens // block_q + batch, kv_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, cu_seqlens_q, context_lens, block_tables,
        scale * LOG2E, batch, window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=group, HEAD_DIM=head_dim, PAGE=page, BLOCK_Q=block_q, BLOCK_M=block_m,
        BLOCK_D=triton.next_power_of_2(head_dim), BLOCK_N=BLOCK_N // 2 if small else BLOCK_N,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        # Hopper-friendly shapes (as in Triton's flash-attention tutorial); 4 warps would spill registers
        # at head_dim 128 or with float32 operands.
        num_warps=8 if head_dim > 64 or q.dtype == torch.float32 else 4, num_stages=3,
    )
    return out

