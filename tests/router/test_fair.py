"""The waiting order of tenants' requests: priorities strictly, tenants by fair queuing over tokens."""

from __future__ import annotations

import pytest

from folio.operator.router.fair import RANK, Claim, FairQueue

CRITICAL, STANDARD, SHEDDABLE = RANK["Critical"], RANK["Standard"], RANK["Sheddable"]


def drain(queue: FairQueue[str]) -> list[str]:
    return [queue.pop() for _ in range(len(queue))]


def test_priorities_go_strictly_first_and_each_in_arrival_order_for_one_tenant() -> None:
    q: FairQueue[str] = FairQueue()
    for item, rank in [("s1", SHEDDABLE), ("n1", STANDARD), ("c1", CRITICAL), ("s2", SHEDDABLE), ("c2", CRITICAL)]:
        q.push(item, Claim("t", rank, 10))
    assert q.peek() == ("c1", Claim("t", CRITICAL, 10))
    assert drain(q) == ["c1", "c2", "n1", "s1", "s2"]
    with pytest.raises(IndexError):
        q.pop()


def test_two_tenants_flooding_alike_take_turns() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(4):
        q.push(f"a{i}", Claim("a", STANDARD, 100))
    for i in range(4):
        q.push(f"b{i}", Claim("b", STANDARD, 100))
    assert drain(q) == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]


def test_the_turns_share_tokens_not_requests() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(3):
        q.push(f"big{i}", Claim("big", STANDARD, 200))
    for i in range(6):
        q.push(f"small{i}", Claim("small", STANDARD, 100))
    order = drain(q)
    # every prefix of the order gives each tenant about the same tokens: two small ones to each big one
    assert order == ["big0", "small0", "small1", "big1", "small2", "small3", "big2", "small4", "small5"]


def test_a_tenant_that_asks_now_and_then_is_not_queued_behind_a_flood() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(50):
        q.push(f"flood{i}", Claim("flood", STANDARD, 100))
    for _ in range(10):
        q.pop()
    q.push("once", Claim("rare", STANDARD, 100))
    assert q.pop() == "once"  # its start is the virtual time now (the last one served), not the flood's end
    assert q.pop() == "flood10"


def test_past_use_is_forgotten_once_a_priority_is_idle() -> None:
    q: FairQueue[str] = FairQueue()
    for i in range(5):
        q.push(f"a{i}", Claim("a", STANDARD, 100))
    drain(q)
    q.push("a5", Claim("a", STANDARD, 100))
    q.push("b0", Claim("b", STANDARD, 100))
    assert drain(q) == ["a5", "b0"]


def test_the_victim_is_the_newest_of_the_lowest_priority_below() -> None:
    q: FairQueue[str] = FairQueue()
    q.push("n1", Claim("a", STANDARD))
    q.push("s1", Claim("a", SHEDDABLE))
    q.push("s2", Claim("b", SHEDDABLE))
    q.push("c1", Claim("c", CRITICAL))
    assert q.victim(CRITICAL) == "s2" and q.victim(STANDARD) == "s2" and q.victim(SHEDDABLE) is None
    assert q.remove("s2") and q.remove("s1") and not q.remove("s1")
    assert q.victim(CRITICAL) == "n1" and q.victim(STANDARD) is None
    assert len(q) == 2 and "n1" in q and "s1" not in q
    assert q.waiting(SHEDDABLE) == 0 and q.waiting_ahead(STANDARD) == 2 and q.waiting_ahead(CRITICAL) == 1
