"""Paged prefill/extend attention over packed var-length queries: Triton vs reference vs SDPA."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folio.kernels.prefill_attention import paged_prefill_attention
from tests.kernels.paged import TOL, dense_attention, make_paged_kv, skip_bf16_dot_in_interpreter


def packed_queries(
    q_lens: list[int], num_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), num_heads, head_dim).to(dtype).to(device)
    return q, cu


def cases(block_size: int) -> tuple[list[int], list[int]]:
    """(context lengths, query lengths): a decode, whole prefills ending on and off block boundaries,
    chunked-prefill / prefix-hit extends whose prefix ends on and off a boundary, and a long context."""
    b = block_size
    return ([1, b, 2 * b + 5, 3 * b, 6 * b - 1], [1, b, 2 * b + 5, b, 30])


# (group, head_dim, block_size, kv_heads): every value of each appears; the product would only cost time.
SHAPES = [(1, 64, 16, 2), (3, 128, 32, 1), (4, 64, 32, 1), (8, 128, 16, 1), (3, 64, 16, 2), (8, 64, 32, 1)]


@pytest.mark.parametrize(("group", "head_dim", "block_size", "kv_heads"), SHAPES)
def test_triton_matches_reference(
    device: torch.device, group: int, head_dim: int, block_size: int, kv_heads: int
) -> None:
    lens, q_lens = cases(block_size)
    kv = make_paged_kv(lens, block_size, kv_heads, head_dim, torch.float32, device)
    q, cu = packed_queries(q_lens, kv_heads * group, head_dim, torch.float32, device)
    args = (q, kv.k_cache, kv.v_cache, cu, kv.context_lens, kv.block_tables, head_dim**-0.5)
    expected = paged_prefill_attention(*args, backend="reference")
    got = paged_prefill_attention(*args, backend="triton")
    torch.testing.assert_close(got, expected, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(device: torch.device, dtype: torch.dtype) -> None:
    skip_bf16_dot_in_interpreter(dtype, device)
    lens, q_lens = [40, 100, 1], [40, 30, 1]
    kv = make_paged_kv(lens, 32, 2, 128, dtype, device)
    q, cu = packed_queries(q_lens, 8, 128, dtype, device)
    args = (q, kv.k_cache, kv.v_cache, cu, kv.context_lens, kv.block_tables, 128**-0.5)
    got = paged_prefill_attention(*args, backend="triton")
    assert got.dtype == dtype
    torch.testing.assert_close(got, paged_prefill_attention(*args, backend="reference"), **TOL[dtype])


def test_sequences_without_new_tokens_are_skipped(device: torch.device) -> None:
    # A zero-length query block in the middle of the batch must not shift its neighbours' tiles.
    kv = make_paged_kv([20, 9, 33], 16, 1, 64, torch.float32, device)
    q, cu = packed_queries([20, 0, 3], 2, 64, torch.float32, device)
    args = (q, kv.k_cache, kv.v_cache, cu, kv.context_lens, kv.block_tables, 0.125)
    expected = paged_prefill_attention(*args, backend="reference")
    torch.testing.assert_close(paged_prefill_attention(*args, backend="triton"), expected, **TOL[torch.float32])


@pytest.mark.parametrize(("group", "block_size"), [(1, 16), (3, 32), (4, 16), (8, 32)])
def test_reference_matches_dense_sdpa(group: int, block_size: int) -> None:
    lens, q_lens = cases(block_size)
    kv = make_paged_kv(lens, block_size, 2, 64, torch.float32, "cpu")
    q, cu = packed_queries(q_lens, 2 * group, 64, torch.float32, torch.device("cpu"))
    out = paged_prefill_attention(q, kv.k_cache, kv.v_cache, cu, kv.context_lens, kv.block_tables, 0.2)
    for b in range(len(lens)):
        lo, hi = int(cu[b]), int(cu[b + 1])
        expected = dense_attention(q[lo:hi], kv.keys[b], kv.values[b], 0.2)
        torch.testing.assert_close(out[lo:hi], expected, **TOL[torch.float32])


def test_decode_through_prefill_matches_decode_kernel(device: torch.device) -> None:
    # One query per sequence: the unified kernel must agree with the dedicated decode path.
    from folio.kernels.decode_attention import paged_decode_attention

    kv = make_paged_kv([1, 16, 50], 16, 2, 64, torch.float32, device)
    q, cu = packed_queries([1, 1, 1], 6, 64, torch.float32, device)
    prefill = paged_prefill_attention(q, kv.k_cache, kv.v_cache, cu, kv.context_lens, kv.block_tables, 0.125,
                                      backend="triton")
    decode = paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125,
                                    backend="triton")
    torch.testing.assert_close(prefill, decode, **TOL[torch.float32])


@settings(max_examples=6, deadline=None, derandomize=True)
@given(
    data=st.lists(st.tuples(st.integers(1, 90), st.integers(0, 89)), min_size=1, max_size=4),
    group=st.sampled_from([1, 2, 3, 5]),
    block_size=st.sampled_from([16, 32]),
)
def test_random_batches_match_reference(data: list[tuple[int, int]], group: int, block_size: int) -> None:
    # Any mix of context and new-token lengths (a new-token count of 0 included) packs and masks correctly.
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lens = [ctx for ctx, _ in data]
    q_lens = [min(new, ctx) for ctx, new in data]
    kv = make_paged_kv(lens, block_size, 1, 64, torch.float32, device)
    q, cu = packed_queries(q_lens, group, 64, torch.float32, device)
    args = (q, kv.k_cache, kv.v_cache, cu, kv.context_lens, kv.block_tables, 0.125)
    torch.testing.assert_close(paged_prefill_attention(*args, backend="triton"),
                               paged_prefill_attention(*args, backend="reference"), **TOL[torch.float32])
