"""The consistent-hash ring and its load bound, as pure functions."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from folio.operator.router.ring import HashRing, key_hash, load_bound, place

KEYS = [key_hash(f"tenant-{i}") for i in range(4000)]


def _ring(members: list[str]) -> HashRing[str]:
    return HashRing(members, str)


def test_key_hash_is_stable_across_processes() -> None:
    # blake2b, not hash(): every router replica (and every restart) must agree on a key's place
    assert key_hash("tenant-0") == int.from_bytes(hashlib.blake2b(b"tenant-0", digest_size=8).digest(), "big")


def test_walk_visits_every_member_once_starting_at_the_owner() -> None:
    ring = _ring(["a", "b", "c", "d"])
    for h in KEYS[:50]:
        order = list(ring.walk(h))
        assert sorted(order) == ["a", "b", "c", "d"]
        assert order[0] == ring.owner(h)
    assert list(_ring([]).walk(KEYS[0])) == []


def test_a_removed_replica_moves_only_its_own_keys() -> None:
    before = _ring(["a", "b", "c", "d"])
    after = _ring(["a", "b", "d"])
    moved = [h for h in KEYS if before.owner(h) != after.owner(h)]
    assert moved, "the removed replica owned some keys"
    assert all(before.owner(h) == "c" for h in moved)
    assert len(moved) == sum(before.owner(h) == "c" for h in KEYS)  # and all of them moved


def test_a_joining_replica_takes_keys_only_for_itself() -> None:
    before = _ring(["a", "b", "c"])
    after = _ring(["a", "b", "c", "e"])
    moved = [h for h in KEYS if before.owner(h) != after.owner(h)]
    assert moved and all(after.owner(h) == "e" for h in moved)
    # with 160 points each, a newcomer takes roughly its fair share (1/4) of the keys
    assert 0.15 < len(moved) / len(KEYS) < 0.35


def test_keys_spread_evenly_over_the_members() -> None:
    owners = Counter(_ring(["a", "b", "c", "d"]).owner(h) for h in KEYS)
    assert max(owners.values()) / (len(KEYS) / 4) < 1.25


def test_member_order_does_not_matter() -> None:
    one, other = _ring(["a", "b", "c"]), _ring(["c", "a", "b"])
    assert all(one.owner(h) == other.owner(h) for h in KEYS[:500])


@pytest.mark.parametrize(
    ("total", "members", "factor", "bound"),
    [(0, 4, 1.25, 1), (4, 4, 1.25, 2), (12, 4, 1.25, 5), (12, 4, 1.0, 4), (100, 3, 2.0, 68)],
)
def test_load_bound(total: int, members: int, factor: float, bound: int) -> None:
    assert load_bound(total, members, factor) == bound


def test_a_hot_key_spills_along_the_ring_once_its_owner_is_over_the_bound() -> None:
    ring = _ring(["a", "b", "c", "d"])
    h = KEYS[0]
    order = list(ring.walk(h))
    loads = Counter[str]()
    placed = []
    for _ in range(40):  # one hot key, requests that never finish
        member, spilled = place(ring, h, loads.__getitem__, lambda m: True, 1.25)
        assert member is not None
        assert spilled == (member != order[0])
        loads[member] += 1
        placed.append(member)
        bound = load_bound(sum(loads.values()) - 1, 4, 1.25)
        assert loads[member] <= bound  # nobody ever goes above the bound it was admitted under
    assert placed[0] == order[0]  # the owner first
    assert set(placed) == set(order)  # then the hot key spread over every replica
    assert max(loads.values()) <= load_bound(39, 4, 1.25)  # 13: 1.25 x the mean, rounded up


def test_place_skips_members_that_are_not_candidates() -> None:
    ring = _ring(["a", "b", "c"])
    h = KEYS[1]
    owner, second = list(ring.walk(h))[:2]
    member, spilled = place(ring, h, lambda m: 0, lambda m: m != owner, 1.25)
    assert member == second and not spilled  # the owner is down: its successor is the key's home now
    assert place(ring, h, lambda m: 0, lambda m: False, 1.25) == (None, False)
