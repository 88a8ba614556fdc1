"""Sliding-window attention (``window=W``: a query sees its last W positions) in every kernel: the PyTorch
references against dense SDPA, the Triton kernels (interpreted on the CPU) and the native CPU kernel
against the references, with windows shorter than, equal to and longer than the contexts, on and off
block boundaries."""

from __future__ import annotations

import pytest
import torch

from folio.kernels import decode_attention_cpu
from folio.kernels.decode_attention import paged_decode_attention
from folio.kernels.prefill_attention import paged_prefill_attention
from tests.kernels.paged import TOL, dense_attention, make_paged_kv
from tests.kernels.test_prefill_attention import cases, packed_queries

WINDOWS = [1, 7, 16, 33, 1000]


def decode_lens(block_size: int) -> list[int]:
    return [1, 5, block_size, block_size + 1, 3 * block_size, 7 * block_size - 3, 0]


@pytest.mark.parametrize("window", WINDOWS)
def test_decode_reference_matches_dense(window: int) -> None:
    lens = decode_lens(16)
    kv = make_paged_kv(lens, 16, 2, 64, torch.float32, "cpu")
    q = torch.randn(len(lens), 6, 64)
    out = paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125,
                                 window=window, backend="reference")
    for b in range(len(lens)):
        expected = dense_attention(q[b : b + 1], kv.keys[b], kv.values[b], 0.125, window)[0]
        torch.testing.assert_close(out[b], expected, **TOL[torch.float32])


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("num_splits", [1, 3, None])
def test_decode_triton_matches_reference(device: torch.device, window: int, num_splits: int | None) -> None:
    # splits divide the window's range: with 3 some end mid-window, some find nothing to read
    kv = make_paged_kv([*decode_lens(16), 300], 16, 2, 64, torch.float32, device)
    q = torch.randn(len(kv.keys), 8, 64, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125)
    expected = paged_decode_attention(*args, window=window, backend="reference")
    got = paged_decode_attention(*args, window=window, backend="triton", num_splits=num_splits)
    torch.testing.assert_close(got, expected, **TOL[torch.float32])


@pytest.mark.skipif(not decode_attention_cpu.AVAILABLE, reason="the C extension was not built")
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize(("dtype", "head_dim"), [(torch.float32, 64), (torch.float32, 40), (torch.bfloat16, 64)])
def test_decode_native_matches_reference(window: int, dtype: torch.dtype, head_dim: int) -> None:
    # head_dim 64 takes the vector path (AVX-512 or AVX2) where the CPU has one; 40 AVX2's or the portable one
    kv = make_paged_kv(decode_lens(16), 16, 2, head_dim, dtype, "cpu")
    q = torch.randn(len(kv.keys), 4, head_dim).to(dtype)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, head_dim**-0.5)
    expected = paged_decode_attention(*args, window=window, backend="reference")
    got = paged_decode_attention(*args, window=window, backend="native")
    torch.testing.assert_close(got, expected, **TOL[dtype])
    assert not got[kv.context_lens == 0].any()


@pytest.mark.parametrize("window", WINDOWS)
def test_prefill_reference_matches_dense(window: int) -> None:
    lens, q_lens = cases(16)
    kv = make_paged_kv(lens, 16, 2, 64, torch.float32, "cpu")
    q, cu = packed_queries(q_lens, 4, 64, torch.float32, torch.device("cpu"))
    out = paged_prefill_attention(q, kv.k_cache, kv.v_cache, cu, kv.context_lens, kv.block_tables, 0.125,
                                  window=window, backend="reference")
    for b in range(len(lens)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        expected = dense_attention(q[rows], kv.keys[b], kv.values[b], 0.125, window)
        torch.testing.assert_close(out[rows], expected, **TOL[torch.float32])


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize(("group", "block_size"), [(1, 16), (4, 32)])
def test_prefill_triton_matches_reference(device: torch.device, window: int, group: int, block_size: int) -> None:
    lens, q_lens = cases(block_size)
    lens, q_lens = [*lens, 200], [*q_lens, 150]  # query tiles whose windows start in different key tiles
    kv = make_paged_kv(lens, block_size, 1, 64, torch.float32, device)
    q, cu = packed_queries(q_lens, group, 64, torch.float32, device)
    args = (q, kv.k_cache, kv.v_cache, cu, kv.context_lens, kv.block_tables, 0.125)
    expected = paged_prefill_attention(*args, window=window, backend="reference")
    got = paged_prefill_attention(*args, window=window, backend="triton")
    torch.testing.assert_close(got, expected, **TOL[torch.float32])


@pytest.mark.parametrize("window", [0, -3, 2.5, True])
def test_bad_windows_are_refused(window: object) -> None:
    kv = make_paged_kv([4], 16, 1, 64, torch.float32, "cpu")
    q = torch.randn(1, 1, 64)
    with pytest.raises(ValueError, match="window"):
        paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.1,
                               window=window)  # type: ignore[arg-type]
