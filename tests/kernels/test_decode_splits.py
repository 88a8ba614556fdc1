"""How decode attention spreads its work: each sequence divides its own context among the splits, so a
short context under a long bound (max_model_len, as the CUDA graphs pass it) still uses every split."""

from __future__ import annotations

import pytest
import torch

from folio.kernels.decode_attention import paged_decode_attention
from folio.kernels.decode_attention_triton import (
    MAX_SPLITS,
    MIN_SPLIT_TOKENS,
    choose_num_splits,
    launch_decode,
    reachable_num_splits,
    warm_up_decode,
)
from tests.kernels.paged import TOL, make_paged_kv


def working_splits(part_lse: torch.Tensor | None) -> list[int]:
    """Per sequence, how many splits of its first head read at least one token."""
    if part_lse is None:
        return []
    return torch.isfinite(part_lse[:, 0]).sum(-1).tolist()


@pytest.mark.parametrize("bound", [4096, 131072])
def test_a_4k_context_uses_every_split_whatever_the_bound(device: torch.device, bound: int) -> None:
    kv = make_paged_kv([4096, 300, 1], 16, 1, 16, torch.float32, device)
    q = torch.randn(3, 4, 16, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.25)
    splits = choose_num_splits(3, 1, bound, q.device)
    out, part_lse = launch_decode(*args, max_context_len=bound, num_splits=None)
    # Before: split_tokens = cdiv(bound, splits), so under the 128k bound the 4k context was one program's
    # work (4096 tokens) and the other splits read nothing.
    assert splits > 1
    assert working_splits(part_lse) == [min(splits, 4096 // MIN_SPLIT_TOKENS), 2, 1]
    expected = paged_decode_attention(*args, backend="reference")
    torch.testing.assert_close(out, expected, **TOL[torch.float32])


def test_a_window_divides_only_the_tokens_it_sees(device: torch.device) -> None:
    kv = make_paged_kv([4096], 16, 1, 16, torch.float32, device)
    q = torch.randn(1, 2, 16, device=device)
    args = (q, kv.k_cache, kv.v_cache, kv.block_tables, kv.context_lens, 0.25)
    out, part_lse = launch_decode(*args, max_context_len=131072, num_splits=None, window=1024)
    assert working_splits(part_lse) == [1024 // MIN_SPLIT_TOKENS]
    expected = paged_decode_attention(*args, window=1024, backend="reference")
    torch.testing.assert_close(out, expected, **TOL[torch.float32])


def test_split_counts_are_few_powers_of_two() -> None:
    """One kernel variant per power of two, not one per split count, over every batch and bound."""
    cpu = torch.device("cpu")
    counts = {choose_num_splits(batch, kv_heads, bound, cpu)
              for batch in range(1, 65) for kv_heads in (1, 2, 4, 8) for bound in range(1, 20000, 97)}
    assert all(c & (c - 1) == 0 and 1 <= c <= MAX_SPLITS for c in counts)
    assert len(counts) <= 6


@pytest.mark.parametrize(("sms", "kv_heads", "bound"), [(132, 8, 8192), (132, 1, 131072), (16, 4, 4096), (8, 8, 4096)])
def test_the_warm_up_reaches_every_split_count_the_engine_can_choose(
    monkeypatch: pytest.MonkeyPatch, sms: int, kv_heads: int, bound: int
) -> None:
    from folio.kernels import decode_attention_triton

    monkeypatch.setattr(decode_attention_triton, "sm_count", lambda device: sms)
    cpu = torch.device("cpu")
    chosen = {choose_num_splits(batch, kv_heads, context, cpu)
              for batch in range(1, 65) for context in range(1, bound + 1, 37)}
    assert set(reachable_num_splits(kv_heads, bound, cpu)) == chosen


def test_the_warm_up_launches_each_reachable_variant(device: torch.device) -> None:
    counts = warm_up_decode(4, 2, 16, 16, torch.float32, device, max_context_len=4096)
    assert counts == reachable_num_splits(2, 4096, device) and counts[0] == 1 and len(counts) > 1
