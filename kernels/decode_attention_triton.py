"""Triton paged decode attention: grouped-query aware, split-K (flash-decoding) for long contexts.

Grid ``(batch, kv_heads, splits)``. A program loads the queries of every head that shares its KV
head (so each K/V tile is read once per group, not once per query head), walks its slice of the
context a tile of ``BLOCK_N`` tokens at a time, looking each token's page up in the block table, and
keeps an online softmax in base 2. With one split it writes the output directly; otherwise it writes
a normalized partial output and its log-sum-exp, and ``_merge_kernel`` combines the splits. With a
sliding window W the walk covers the last W tokens only (``window`` 0: the whole context), and the splits
divide that range.

Each sequence divides its own context among the splits (``cdiv(context, NUM_SPLITS)``, as SGLang's and
lightllm's stage-1 kernels do), at most one split per ``MIN_SPLIT`` tokens: the host's bound on the
context (max_model_len under CUDA graphs) only caps the split count, so a 4k context under a 128k bound
still spreads over every split instead of landing whole in the first. Split counts the host picks are
powers of two, and the arguments whose values vary from step to step are not specialized on, so a
growing context does not recompile the kernels. Nor is the alignment of the block tables and context
lengths: a mixed step passes its decodes' rows as views past its prefills', at any offset.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from folio.kernels._backend import ensure_launchable
from folio.kernels.layout import BLOCK_TABLE_DTYPE, CONTEXT_LENS_DTYPE

LOG2E = 1.4426950408889634
BLOCK_N = 64                 # context tokens per tile
MIN_SPLIT_TOKENS = 256       # below this a split's fixed cost outweighs the parallelism it adds
MAX_SPLITS = 32


@triton.jit(do_not_specialize=["block_tables_ptr", "context_lens_ptr", "window", "stride_bt"])
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr,
    scale_log2, window,
    stride_qb, stride_qh, stride_ob, stride_oh, stride_bt,
    stride_kb, stride_kt, stride_kh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    MIN_SPLIT: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_heads = tl.num_programs(1) * GROUP

    ctx = tl.load(context_lens_ptr + seq)
    first = tl.where(window > 0, tl.maximum(ctx - window, 0), 0)  # the first token the query sees
    span = ctx - first
    # This sequence's splits: whole tiles, so that only its last tile is ragged; splits past them are empty.
    active = tl.maximum(tl.minimum((span + MIN_SPLIT - 1) // MIN_SPLIT, NUM_SPLITS), 1)
    split_tokens = ((span + active - 1) // active + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    start = first + split * split_tokens
    end = tl.minimum(start + split_tokens, ctx)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile in range(start, end, BLOCK_N):
        pos = tile + n
        valid = pos < end
        page = tl.load(table + pos // PAGE, mask=valid, other=0).to(tl.int64)
        rows = page * stride_kb + (pos % PAGE) * stride_kt + kv_head * stride_kh
        kv_mask = valid[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2        # [G, N]
        s = tl.where(valid[None, :], s, float("-inf"))
        # The tile holds at least one valid token, so m_new is finite and no NaN appears.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_cache_ptr + rows[:, None] + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    empty = l_i == 0.0  # this split has no tokens (or the context is empty)
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    o_mask = g_mask[:, None] & d_mask[None, :]
    if NUM_SPLITS == 1:
        tl.store(out_ptr + seq * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=o_mask)
    else:
        row = (seq * num_heads + heads) * NUM_SPLITS + split                              # [G]
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :], o, mask=o_mask)
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        tl.store(part_lse_ptr + row, lse, mask=g_mask)


@triton.jit
def _merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    num_heads = tl.num_programs(1)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_mask = s < NUM_SPLITS
    d_mask = d < HEAD_DIM
    row = (seq * num_heads + head) * NUM_SPLITS + s
    lse = tl.load(part_lse_ptr + row, mask=s_mask, other=float("-inf"))
    lse_max = tl.max(lse, 0)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # empty context: all weights are 0
    w = tl.exp2(lse - lse_max)
    total = tl.sum(w, 0)
    o = tl.load(part_out_ptr + row[:, None] * HEAD_DIM + d[None, :],
                mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    o = tl.sum(o * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + d, o.to(out_ptr.dtype.element_ty), mask=d_mask)


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """The device's streaming multiprocessors (8 stands in for CPU tensors under the interpreter)."""
    return _num_sms(device.index or 0) if device.type == "cuda" else 8


def choose_num_splits(batch: int, kv_heads: int, max_context_len: int, device: torch.device) -> int:
    """Enough splits to give every SM about two programs, never one shorter than ``MIN_SPLIT_TOKENS``."""
    sms = sm_count(device)
    programs = batch * kv_heads
    if programs >= sms:
        return 1
    wanted = triton.cdiv(2 * sms, programs)
    useful = triton.cdiv(max(max_context_len, 1), MIN_SPLIT_TOKENS)
    # a power of two: a handful of kernel variants over every batch size and bound, not one per count
    return min(triton.next_power_of_2(max(1, min(wanted, useful))), MAX_SPLITS)


def decode_attention_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, *, max_context_len: int, num_splits: int | None,
    window: int | None = None,
) -> torch.Tensor:
    """Launches on inputs checked by ``folio.kernels.decode_attention.paged_decode_attention``."""
    return launch_decode(q, k_cache, v_cache, block_tables, context_lens, scale, max_context_len=max_context_len,
                         num_splits=num_splits, window=window)[0]


def launch_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, *, max_context_len: int, num_splits: int | None,
    window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output and, with several splits, each split's log-sum-exp ``[batch, heads, splits]`` (-inf where
    a split read no token: what the tests count the programs that worked by)."""
    ensure_launchable(_decode_kernel, q.device)
    if num_splits is not None:  # a forced count is used whole (tests, benchmarks)
        return _launch(q, k_cache, v_cache, block_tables, context_lens, scale, window, num_splits, BLOCK_N)
    attended = max_context_len if window is None else min(max_context_len, window)  # tokens one query reads
    num_splits = choose_num_splits(q.shape[0], k_cache.shape[2], attended, q.device)
    return _launch(q, k_cache, v_cache, block_tables, context_lens, scale, window, num_splits, MIN_SPLIT_TOKENS)


def reachable_num_splits(kv_heads: int, max_context_len: int, device: torch.device) -> list[int]:
    """Every split count ``choose_num_splits`` gives for any batch and contexts up to max_context_len:
    with the other constants fixed by the model, one decode kernel variant each."""
    # The count grows with the context (in steps of MIN_SPLIT_TOKENS) and never with the batch, so the
    # one-sequence batch at every context step reaches them all.
    steps = triton.cdiv(max(max_context_len, 1), MIN_SPLIT_TOKENS)
    return sorted({choose_num_splits(1, kv_heads, k * MIN_SPLIT_TOKENS, device) for k in range(1, steps + 1)})


def warm_up_decode(
    num_heads: int, kv_heads: int, head_dim: int, page: int, dtype: torch.dtype, device: torch.device, *,
    max_context_len: int,
) -> list[int]:
    """Compiles, on one-token dummies, each decode (and merge) variant the engine can launch, so that no
    request waits for Triton's compiler; returns the split counts warmed."""
    counts = reachable_num_splits(kv_heads, max_context_len, device)
    q = torch.zeros(1, num_heads, head_dim, dtype=dtype, device=device)
    cache = torch.zeros(1, page, kv_heads, head_dim, dtype=dtype, device=device)
    tables = torch.zeros(1, 1, dtype=BLOCK_TABLE_DTYPE, device=device)
    lens = torch.ones(1, dtype=CONTEXT_LENS_DTYPE, device=device)
    for count in counts:
        _launch(q, cache, cache, tables, lens, 1.0, None, count, MIN_SPLIT_TOKENS)
    return counts


def _launch(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, window: int | None, num_splits: int, min_split: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    batch, num_heads, head_dim = q.shape
    _, page, kv_heads, _ = k_cache.shape
    group = num_heads // kv_heads
    out = torch.empty_like(q)
    if num_splits > 1:
        part_out = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused by the kernel
    block_d = triton.next_power_of_2(head_dim)
    _decode_kernel[(batch, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, part_out, part_lse,
        scale * LOG2E, window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        GROUP=group, HEAD_DIM=head_dim, PAGE=page, NUM_SPLITS=num_splits,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_D=block_d, BLOCK_N=BLOCK_N,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", MIN_SPLIT=min_split,
        num_warps=4, num_stages=2,
    )
    if num_splits > 1:
        _merge_kernel[(batch, num_heads)](
            part_out, part_lse, out, out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
            BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
        )
        return out, part_lse
    return out, None
