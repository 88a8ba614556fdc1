from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from folio.operator.router.split import WeightedSplit


def test_ninety_ten_over_two_thousand_requests() -> None:
    split = WeightedSplit([("stable", 90), ("canary", 10)])
    picks = [split.choose() for _ in range(2000)]
    share = picks.count("canary") / len(picks)
    assert abs(share - 0.10) <= 0.02
    assert Counter(picks) == {"stable": 1800, "canary": 200}  # exact, in fact
    # interleaved, not bunched: one canary pick in every window of ten
    assert all(picks[i : i + 10].count("canary") == 1 for i in range(0, 2000, 10))


@given(st.lists(st.integers(min_value=0, max_value=100), min_size=1, max_size=5))
def test_any_weights_are_split_exactly_per_cycle(weights: list[int]) -> None:
    names = [f"r{i}" for i in range(len(weights))]
    split = WeightedSplit(zip(names, weights, strict=True))
    total = sum(weights)
    if total == 0:
        assert split.choose() is None
        return
    picks = Counter(split.choose() for _ in range(total * 3))
    assert picks == {n: 3 * w for n, w in zip(names, weights, strict=True) if w > 0}


def test_zero_weights_are_never_picked() -> None:
    split = WeightedSplit([("a", 0), ("b", 5)])
    assert {split.choose() for _ in range(50)} == {"b"}
    assert split.weights == {"b": 5}
    assert WeightedSplit([]).choose() is None
