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


def test_a_key_no_member_holds_goes_to_the_least_loaded_ties_in_ring_order() -> None:
    ring = _ring(["a", "b", "c", "d"])
    h = KEYS[2]
    order = list(ring.walk(h))
    loads = {order[0]: 2, order[1]: 1, order[2]: 1, order[3]: 3}
    # the bound (ceil(1.25 x 8 / 4) = 3) would take the owner; with no cache to meet, the least loaded wins
    assert place(ring, h, loads.__getitem__, lambda m: True, 1.25) == (order[0], False)
    assert place(ring, h, loads.__getitem__, lambda m: True, 1.25, holders=None) == (order[1], True)
    usage = {order[1]: 0.9, order[2]: 0.1}
    tie = lambda m: usage.get(m, 0.0)  # noqa: E731
    assert place(ring, h, loads.__getitem__, lambda m: True, 1.25, holders=None, tie=tie) == (order[2], True)
    idle = place(ring, h, lambda m: 0, lambda m: True, 1.25, holders=None)
    assert idle == (order[0], False)  # an idle ring: the owner, so the key's next request finds it there


def test_distinct_keys_with_no_holders_spread_like_least_loaded() -> None:
    ring = _ring(["a", "b", "c", "d"])
    loads = Counter[str]()
    for h in KEYS[:401]:  # requests that never finish, each with a prefix of its own
        member, _ = place(ring, h, loads.__getitem__, lambda m: True, 1.25, holders=None)
        assert member is not None
        loads[member] += 1
        assert max(loads.values()) - min(loads[m] for m in "abcd") <= 1
    # on the ring alone the same keys pile up on their owners, up to the bound
    ringed = Counter[str]()
    for h in KEYS[:401]:
        member, _ = place(ring, h, ringed.__getitem__, lambda m: True, 1.25)
        assert member is not None
        ringed[member] += 1
    assert max(ringed.values()) - min(ringed.values()) > 1


def test_a_key_goes_back_to_a_member_that_holds_it_before_the_ring_choice() -> None:
    ring = _ring(["a", "b", "c", "d"])
    h = KEYS[3]
    owner, second, third, fourth = ring.walk(h)
    loads = {owner: 1, second: 1, third: 1, fourth: 0}
    # it spilled to `third` once: there it goes (under ceil(1.25 x 4 / 4) = 2; no spill: its cache is there),
    # not to its owner nor to the idle one
    assert place(ring, h, loads.__getitem__, lambda m: True, 1.25, holders={third}) == (third, False)
    # of several holders under the bound, the least loaded; ring order between equals
    assert place(ring, h, loads.__getitem__, lambda m: True, 1.25, holders={fourth, third}) == (fourth, False)
    assert place(ring, h, loads.__getitem__, lambda m: True, 1.25, holders={second, third}) == (second, False)
    assert place(ring, h, loads.__getitem__, lambda m: True, 1.25, holders={owner, second}) == (owner, False)
    # every holder over the bound (ceil(1.25 x 5 / 4) = 2): along the ring from the owner, and that is a spill
    loads = {owner: 1, second: 0, third: 3, fourth: 0}
    assert place(ring, h, loads.__getitem__, lambda m: True, 1.25, holders={third}) == (owner, True)
    # a holder that is not a candidate (down) is passed over the same way
    assert place(ring, h, lambda m: 0, lambda m: m != third, 1.25, holders={third}) == (owner, True)
