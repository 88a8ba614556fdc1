"""Paged decode attention: the Triton kernel against its reference, and the reference against SDPA."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.decode_attention import paged_decode_attention
from tests.kernels.paged import TOL, dense_attention, make_paged_kv, skip_bf16_dot_in_interpreter


def ragged_lens(block_size: int) -> list[int]:
    """Length 1, exact block boundaries, one past a boundary, and a context spanning many blocks."""
    return [1, block_size, block_size + 1, 3 * block_size, 7 * block_size - 3]


# Every group size, head_dim and block size appears; the full product would only cost time.
SHAPES = [(1, 64, 16), (3, 128, 32), (4, 64, 32), (8, 128, 16), (3, 64, 16), (8, 64, 32)]


@pytest.mark.parametrize(("group", "head_dim", "block_size"), SHAPES)
def test_triton_matches_reference(device: torch.device, group: int, head_dim: int, block_size: int) -> None:
    kv_heads = 2
    kv = make_paged_kv(ragged_lens(block_size), block_size, kv_heads, head_dim, torch.float32, device)
    q = torch.randn(len(kv.keys), kv_heads * group, head_dim, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, head_dim**-0.5)
    expected = paged_decode_attention(*args, backend="reference")
    got = paged_decode_attention(*args, backend="triton", num_splits=1)
    torch.testing.assert_close(got, expected, **TOL[torch.float32])


@pytest.mark.parametrize("num_splits", [2, 5, None])
def test_split_k_merges_partitions(device: torch.device, num_splits: int | None) -> None:
    # Splits that end mid-sequence, splits with nothing left to read, and the automatic choice.
    kv = make_paged_kv([1, 17, 300, 64], 16, 1, 64, torch.float32, device)
    q = torch.randn(4, 4, 64, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125)
    expected = paged_decode_attention(*args, backend="reference")
    got = paged_decode_attention(*args, backend="triton", num_splits=num_splits)
    torch.testing.assert_close(got, expected, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(device: torch.device, dtype: torch.dtype) -> None:
    skip_bf16_dot_in_interpreter(dtype, device)
    kv = make_paged_kv([1, 32, 100], 32, 2, 128, dtype, device)
    q = torch.randn(3, 8, 128, device=device).to(dtype)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 128**-0.5)
    expected = paged_decode_attention(*args, backend="reference")
    for splits in (1, 3):
        got = paged_decode_attention(*args, backend="triton", num_splits=splits)
        assert got.dtype == dtype
        torch.testing.assert_close(got, expected, **TOL[dtype])


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_empty_context_gives_zeros(device: torch.device, backend: str) -> None:
    # A padded batch slot (context length 0) must not poison its neighbours with NaN.
    kv = make_paged_kv([0, 5], 16, 1, 64, torch.float32, device)
    q = torch.randn(2, 2, 64, device=device)
    for splits in (1, 2):
        out = paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.125,
                                     backend=backend, num_splits=splits)  # type: ignore[arg-type]
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        torch.testing.assert_close(out[1], dense_attention(q[1:], kv.keys[1], kv.values[1], 0.125)[0])


@pytest.mark.parametrize(("group", "block_size"), [(1, 16), (3, 32), (4, 16), (8, 32)])
def test_reference_matches_dense_sdpa(group: int, block_size: int) -> None:
    lens = ragged_lens(block_size)
    kv = make_paged_kv(lens, block_size, 3, 64, torch.float32, "cpu")
    q = torch.randn(len(lens), 3 * group, 64)
    out = paged_decode_attention(q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.3)
    for b in range(len(lens)):
        expected = dense_attention(q[b : b + 1], kv.keys[b], kv.values[b], 0.3)[0]
        torch.testing.assert_close(out[b], expected, **TOL[torch.float32])
