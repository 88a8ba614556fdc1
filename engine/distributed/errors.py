"""The error of a tensor-parallel group that lost a rank: the replica cannot serve any more."""

from __future__ import annotations


class RankFailedError(RuntimeError):
    """A rank died, or a collective stalled past the watchdog's timeout."""
