"""A consistent-hash ring with bounded loads: where a request's affinity key lives among a revision's replicas.

Each member owns `VNODES` points on a 64-bit ring; a key belongs to the first member clockwise from the
key's hash. A member that joins or leaves takes or gives up only its own points, so every other key keeps
its replica (and the KV cache it built there). The bound (Mirrokni et al., "Consistent Hashing with
Bounded Loads", the scheme KubeAI uses) keeps a hot key from burying its owner: a member already at
`ceil(factor × (total load + 1) / members)` passes the request on to the next member along the ring.
`place` also takes the members a key went to lately (where its prefix is cached), the least loaded of
them first, before the ring's own choice, and sends a key that none can hold yet to the least loaded
member.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Collection, Hashable, Iterator, Sequence
from typing import Generic, TypeVar

M = TypeVar("M", bound=Hashable)

VNODES = 160  # points per member: the share of keys per member stays within about ±10% with 4 members


def key_hash(key: str) -> int:
    """A stable 64-bit hash (the same in every router process, unlike `hash()`)."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


class HashRing(Generic[M]):
    """The members of one pool on a ring; `name(member)` gives the stable identity that is hashed."""

    __slots__ = ("_hashes", "_members", "_owners")

    def __init__(self, members: Sequence[M], name: Callable[[M], str], vnodes: int = VNODES) -> None:
        points = sorted(
            (key_hash(f"{name(member)}#{i}"), index) for index, member in enumerate(members) for i in range(vnodes)
        )
        self._members = list(members)
        self._hashes = [h for h, _ in points]
        self._owners = [index for _, index in points]

    def __len__(self) -> int:
        return len(self._members)

    def walk(self, hashed: int) -> Iterator[M]:
        """Every member once, in ring order from the owner of `hashed` on."""
        n = len(self._members)
        if n == 0:
            return
        seen: set[int] = set()
        hashes, owners = self._hashes, self._owners
        start = bisect.bisect_left(hashes, hashed)
        for offset in range(len(hashes)):
            index = owners[(start + offset) % len(hashes)]
            if index not in seen:
                seen.add(index)
                yield self._members[index]
                if len(seen) == n:
                    return

    def owner(self, hashed: int) -> M | None:
        return next(self.walk(hashed), None)


def load_bound(total_load: int, members: int, factor: float) -> int:
    """The most load a member may carry after taking one more request (always at least the least loaded's)."""
    assert members > 0 and factor >= 1.0
    return math.ceil(factor * (total_load + 1) / members)


def place(
    ring: HashRing[M],
    hashed: int,
    load: Callable[[M], int],
    candidates: Callable[[M], bool],
    factor: float,
    *,
    holders: Collection[M] | None = (),
    tie: Callable[[M], float] | None = None,
) -> tuple[M | None, bool]:
    """The member for a key: its owner among `candidates` unless that is over the bound, then the next along
    the ring that is not. Returns (member, spilled); (None, False) when no member is a candidate.

    `holders` are the members the key went to lately, whose caches may hold its prefix: the least loaded of
    them under the bound (ties in ring order) comes before the ring's own choice, so a key that spilled or
    was placed off its owner keeps meeting its cache instead of warming another one, and its traffic
    spreads over its holders rather than filling the first to the bound; `spilled` then says the key left
    them (or its owner, when it has no holders). `holders` None says no member can hold the key yet
    (nobody placed it lately): there is no cache to meet, so the key goes where it queues least — the least
    loaded candidate, ties broken by `tie` (lower first: e.g. how full its KV cache is), then by ring order
    (the owner first when it is among them) — and `spilled` says it is not its owner. Distinct keys then spread as evenly as least-loaded placement
    spreads them, while a key that comes back finds where it went."""
    usable = [m for m in ring.walk(hashed) if candidates(m)]
    if not usable:
        return None, False
    loads = [load(m) for m in usable]
    if holders is None:
        ranks = [(member_load, tie(m) if tie is not None else 0.0) for m, member_load in zip(usable, loads, strict=True)]
        position = ranks.index(min(ranks))
        return usable[position], position > 0
    bound = load_bound(sum(loads), len(usable), factor)
    if holders:
        held = [(member_load, i) for i, (m, member_load) in enumerate(zip(usable, loads, strict=True))
                if m in holders and member_load + 1 <= bound]
        if held:
            return usable[min(held)[1]], False
    for position, member_load in enumerate(loads):
        if member_load + 1 <= bound:
            return usable[position], bool(holders) or position > 0
    # Unreachable: the least loaded member is at most the floor of the mean, which the bound admits.
    raise AssertionError(f"no member under the load bound {bound}")
