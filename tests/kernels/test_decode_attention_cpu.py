"""The native CPU decode-attention kernel (kernels/csrc) against the PyTorch reference.

It is what the engine's CPU path runs for decodes, so every layout case matters here: group sizes, head_dims
on each vector path this CPU has (AVX-512, AVX2) and the portable one, block sizes, ragged and empty contexts, strided queries, threads.
"""

from __future__ import annotations

import pytest
import torch

from folio.kernels import decode_attention_cpu
from folio.kernels.decode_attention import paged_decode_attention
from tests.kernels.conftest import each_simd_width
from tests.kernels.paged import TOL, PagedKV, make_paged_kv

pytestmark = pytest.mark.skipif(not decode_attention_cpu.AVAILABLE, reason="the C extension was not built")
simd_width = each_simd_width(decode_attention_cpu._cpu_attention, portable=True)


def native_with_threads(threads: int, *args: object, **kwargs: object) -> torch.Tensor:
    """The native kernel's result on ``threads`` of torch's threads (the count restored after)."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        return paged_decode_attention(*args, **kwargs, backend="native")  # type: ignore[arg-type]
    finally:
        torch.set_num_threads(before)


def lens_for(block_size: int) -> list[int]:
    return [1, block_size, block_size + 1, 3 * block_size, 7 * block_size - 3, 0, 2]


# head_dim 64/128 take the vector path at either width; 80 and 40 only AVX2's (multiples of 8, not 16).
SHAPES = [(1, 64, 16), (3, 128, 32), (4, 64, 32), (8, 128, 16), (3, 80, 16), (2, 40, 8)]


@pytest.mark.parametrize(("group", "head_dim", "block_size"), SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_matches_reference(group: int, head_dim: int, block_size: int, dtype: torch.dtype) -> None:
    kv_heads = 2
    kv = make_paged_kv(lens_for(block_size), block_size, kv_heads, head_dim, dtype, "cpu")
    q = torch.randn(len(kv.keys), kv_heads * group, head_dim).to(dtype)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, head_dim**-0.5)
    expected = paged_decode_attention(*args, backend="reference")
    got = paged_decode_attention(*args, backend="native")
    assert got.dtype == dtype
    torch.testing.assert_close(got, expected, **TOL[dtype])
    assert not got[kv.context_lens == 0].any()  # an empty context yields zeros, never NaN


def test_auto_picks_native_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    kv = make_paged_kv([5, 40], 16, 1, 64, torch.float32, "cpu")
    q = torch.randn(2, 3, 64)
    calls = []
    real = decode_attention_cpu.decode_attention_cpu
    monkeypatch.setattr(decode_attention_cpu, "decode_attention_cpu", lambda *a, **k: calls.append(1) or real(*a, **k))
    paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125)
    assert calls == [1]
    paged_decode_attention(q.half(), kv.k_cache.half(), kv.v_cache.half(), kv.block_tables, kv.context_lens, 0.125)
    assert calls == [1]  # float16 is not supported natively: the reference ran


def test_strided_queries_like_the_fused_qkv_output() -> None:
    # The engine hands over a view of its fused QKV projection: rows far apart, heads contiguous.
    kv = make_paged_kv([9, 33, 70], 16, 2, 64, torch.float32, "cpu")
    qkv = torch.randn(3, 8 + 2 + 2, 64)
    q = qkv[:, :8]
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125)
    torch.testing.assert_close(paged_decode_attention(*args, backend="native"),
                               paged_decode_attention(*args, backend="reference"), **TOL[torch.float32])


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_threads_split_the_batch_without_changing_results(threads: int) -> None:
    # Enough work that every thread gets sequences, uneven lengths so the split is by context, not count.
    lens = [700, 3, 1, 512, 260, 90, 1000, 16, 17, 333, 0, 64]
    kv = make_paged_kv(lens, 16, 4, 128, torch.float32, "cpu")
    q = torch.randn(len(lens), 32, 128)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 128**-0.5)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = paged_decode_attention(*args, backend="native")
        torch.set_num_threads(threads)
        multi = paged_decode_attention(*args, backend="native")
    finally:
        torch.set_num_threads(before)
    assert torch.equal(single, multi)  # each sequence is computed by one thread, the same way
    torch.testing.assert_close(multi, paged_decode_attention(*args, backend="reference"), **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("lens", "threads", "window"),
    [([900], 2, None), ([901], 4, None), ([700, 1000], 4, None), ([333, 1000, 17], 8, None), ([900], 3, 300),
     ([1000], 8, 129), ([120], 2, None)],
)  # fmt: skip
def test_few_sequences_split_their_contexts_over_threads(
    dtype: torch.dtype, lens: list[int], threads: int, window: int | None
) -> None:
    # Fewer sequences than threads: each long context runs in parts, one thread each, merged by their maxima
    # (the last case is too short to split). SmolLM2's heads: 9 query heads on 3 KV heads of 64.
    kv = make_paged_kv(lens, 16, 3, 64, dtype, "cpu")
    q = torch.randn(len(lens), 9, 64).to(dtype)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 64**-0.5)
    got = native_with_threads(threads, *args, window=window)
    torch.testing.assert_close(got, paged_decode_attention(*args, window=window, backend="reference"), **TOL[dtype])


def test_a_bad_block_id_in_a_split_context_is_refused() -> None:
    kv = make_paged_kv([900], 16, 3, 64, torch.float32, "cpu")
    q = torch.randn(1, 9, 64)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for page in (2, 50):  # in the first part, in the second
            tables = kv.block_tables.clone()
            tables[0, page] = kv.k_cache.shape[0]
            with pytest.raises(ValueError, match="block id outside"):
                paged_decode_attention(q, kv.k_cache, kv.v_cache, tables, kv.context_lens, 0.125, backend="native")
    finally:
        torch.set_num_threads(before)


def test_a_block_id_outside_the_cache_is_refused_not_read() -> None:
    kv = make_paged_kv([20, 5], 16, 1, 64, torch.float32, "cpu")
    tables = kv.block_tables.clone()
    tables[0, 1] = kv.k_cache.shape[0]  # the second page of a 20-token context
    q = torch.randn(2, 1, 64)
    with pytest.raises(ValueError, match="block id outside"):
        paged_decode_attention(q, kv.k_cache, kv.v_cache, tables, kv.context_lens, 0.125, backend="native")
    for bad in (2**31 - 1, -(2**31)):  # the next sequence's pages are prefetched before they are checked
        tables = kv.block_tables.clone()
        tables[1, 0] = bad
        with pytest.raises(ValueError, match="block id outside"):
            paged_decode_attention(q, kv.k_cache, kv.v_cache, tables, kv.context_lens, 0.125, backend="native")
    tables = kv.block_tables.clone()
    tables[1, 1:] = -7  # past the 5-token context: never read, so allowed (as the layout says)
    paged_decode_attention(q, kv.k_cache, kv.v_cache, tables, kv.context_lens, 0.125, backend="native")


def test_native_backend_refuses_what_it_cannot_run() -> None:
    kv = make_paged_kv([3], 16, 1, 64, torch.float16, "cpu")
    q = torch.randn(1, 1, 64).half()
    with pytest.raises(ValueError, match="native CPU kernel cannot run"):
        paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125, backend="native")


def test_exp_matches_torch_on_softmax_arguments() -> None:
    # Scores spread over the whole range the kernel's exp sees (x - max <= 0), one sequence, one head.
    scores = torch.linspace(-100.0, 0.0, 4099)
    k_cache = torch.zeros(4099, 1, 1, 16)
    k_cache[:, 0, 0, 0] = scores  # q = e0 and scale 1: the score of token t is scores[t]
    v_cache = torch.zeros_like(k_cache)
    v_cache[:, 0, 0, 1] = torch.arange(4099, dtype=torch.float32)
    q = torch.zeros(1, 1, 16)
    q[0, 0, 0] = 1.0
    table = torch.arange(4099, dtype=torch.int32)[None]
    lens = torch.tensor([4099], dtype=torch.int32)
    out = paged_decode_attention(q, k_cache, v_cache, table, lens, 1.0, backend="native")
    p = torch.softmax(scores.double(), 0)
    expected = (p * torch.arange(4099, dtype=torch.float64)).sum()
    assert out[0, 0, 1].item() == pytest.approx(expected.item(), rel=1e-5)


def verify_layout(kv: PagedKV, bundles: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Block tables and lengths of verify-step rows: per (sequence, rows), that sequence's last ``rows``
    positions as consecutive rows over its one block table, as the engine lays a verifying sequence out."""
    tables, lens = [], []
    for seq, rows in bundles:
        end = int(kv.context_lens[seq])
        for j in range(rows):
            tables.append(kv.block_tables[seq])
            lens.append(end - rows + 1 + j)
    return torch.stack(tables).contiguous(), torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 100])
def test_verify_rows_of_one_context_match_the_reference(dtype: torch.dtype, window: int | None) -> None:
    # A verify step: each sequence's positions as consecutive rows sharing its block table (read once for
    # all of them on the vector path), plain decode rows between them, a row of equal length beside its
    # twin, and a sequence that shares its first pages with another (the prefix cache) but not its last.
    kv = make_paged_kv([300, 41, 17, 900, 5, 333], 16, 3, 64, dtype, "cpu")
    kv.block_tables[5, :2] = kv.block_tables[0, :2]
    tables, lens = verify_layout(kv, [(0, 9), (1, 1), (2, 3), (4, 1), (3, 17), (5, 2), (0, 1), (0, 1), (5, 4)])
    q = torch.randn(len(lens), 9, 64).to(dtype)
    args = (q, kv.k_cache, kv.v_cache, tables, lens, 64**-0.5)
    expected = paged_decode_attention(*args, window=window, backend="reference")
    for threads in (1, 2, 3):
        torch.testing.assert_close(native_with_threads(threads, *args, window=window), expected, **TOL[dtype])
    alone = torch.cat([native_with_threads(1, q[b : b + 1], kv.k_cache, kv.v_cache, tables[b : b + 1],
                                           lens[b : b + 1], 64**-0.5, window=window) for b in range(len(lens))])
    assert torch.equal(native_with_threads(1, *args, window=window), alone)  # the same sums in a bundle as alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("end", "rows", "threads", "window"),
                         [(900, 9, 2, None), (901, 17, 4, None), (700, 5, 3, 300), (60, 9, 2, None)])  # fmt: skip
def test_one_verifying_sequence_splits_its_context_over_threads(
    dtype: torch.dtype, end: int, rows: int, threads: int, window: int | None
) -> None:
    # One client speculating: a single bundle of rows, cut into pieces of rows, a thread each (with more threads
    # than rows, single rows whose contexts split; the last case is too short to split).
    kv = make_paged_kv([end], 16, 3, 64, dtype, "cpu")
    tables, lens = verify_layout(kv, [(0, rows)])
    q = torch.randn(rows, 9, 64).to(dtype)
    args = (q, kv.k_cache, kv.v_cache, tables, lens, 64**-0.5)
    got = native_with_threads(threads, *args, window=window)
    torch.testing.assert_close(got, paged_decode_attention(*args, window=window, backend="reference"), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pieces_of_a_bundle_split_their_contexts_where_threads_are_left(dtype: torch.dtype) -> None:
    # 8 threads, 3 bundles: the 9 verify rows in two pieces of several rows, then 4 pieces for 8 threads, so
    # each piece's context is split in two and every row of a piece merges its parts.
    kv = make_paged_kv([900, 700, 800], 16, 3, 64, dtype, "cpu")
    tables, lens = verify_layout(kv, [(0, 9), (1, 1), (2, 1)])
    q = torch.randn(len(lens), 9, 64).to(dtype)
    args = (q, kv.k_cache, kv.v_cache, tables, lens, 64**-0.5)
    got = native_with_threads(8, *args)
    torch.testing.assert_close(got, paged_decode_attention(*args, backend="reference"), **TOL[dtype])


def test_a_bad_block_id_in_a_verify_bundle_is_refused() -> None:
    kv = make_paged_kv([200], 16, 3, 64, torch.float32, "cpu")
    kv.block_tables[0, 5] = kv.k_cache.shape[0]
    tables, lens = verify_layout(kv, [(0, 4)])
    with pytest.raises(ValueError, match="block id outside"):
        paged_decode_attention(torch.randn(4, 9, 64), kv.k_cache, kv.v_cache, tables, lens, 0.125, backend="native")
