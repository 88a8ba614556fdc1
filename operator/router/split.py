"""Weighted choice of a revision for each request.

Smooth weighted round-robin (the algorithm nginx uses): every revision's credit grows by its
weight on each pick and the winner pays back the total. Over any window of `sum(weights)`
requests the split is exact and the picks are interleaved (90/10 sends every tenth request to
the canary), so even a low-traffic 5% step reaches the analysis' minimum request count on
schedule, which random sampling does not guarantee.
"""

from __future__ import annotations

from collections.abc import Iterable


class WeightedSplit:
    __slots__ = ("_credit", "_names", "_total", "_weights")

    def __init__(self, weights: Iterable[tuple[str, int]]) -> None:
        pairs = [(name, w) for name, w in weights if w > 0]
        self._names = [name for name, _ in pairs]
        self._weights = [w for _, w in pairs]
        self._total = sum(self._weights)
        self._credit = [0] * len(pairs)

    @property
    def weights(self) -> dict[str, int]:
        return dict(zip(self._names, self._weights, strict=True))

    def choose(self) -> str | None:
        """The revision for the next request, or None when no revision has a positive weight."""
        if len(self._names) <= 1:
            return self._names[0] if self._names else None
        credit, weights = self._credit, self._weights
        best = 0
        for i, w in enumerate(weights):
            credit[i] += w
            if credit[i] > credit[best]:
                best = i
        credit[best] -= self._total
        return self._names[best]
