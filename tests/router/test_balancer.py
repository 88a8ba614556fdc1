from __future__ import annotations

from collections import Counter

from folio.operator.router.balancer import Balancer


def test_fewest_in_flight_wins() -> None:
    b = Balancer()
    b.update({"r1": ["http://a", "http://b", "http://c"]})
    a, bb, c = b.replicas()
    a.in_flight, bb.in_flight, c.in_flight = 3, 1, 2
    assert b.pick("r1") is bb
    bb.in_flight = 5
    assert b.pick("r1") is c


def test_ties_rotate_so_idle_replicas_share_the_load() -> None:
    b = Balancer()
    b.update({"r1": ["http://a", "http://b", "http://c"]})
    assert Counter(b.pick("r1").url for _ in range(30)) == {"http://a": 10, "http://b": 10, "http://c": 10}


def test_unhealthy_and_excluded_replicas_are_skipped() -> None:
    b = Balancer()
    b.update({"r1": ["http://a", "http://b"], "r2": ["http://c"]})
    a, bb, c = b.replicas()
    a.mark_down("refused")
    assert {b.pick("r1").url for _ in range(4)} == {"http://b"}
    assert b.pick("r1", exclude=[bb]) is None
    assert b.pick_any(["r1"], exclude=[bb]) is c
    assert b.pick("nope") is None and b.pick(None) is None
    assert b.ready_count() == 2
    a.mark_up()
    assert b.ready_count() == 3


def test_update_keeps_state_of_replicas_that_stay() -> None:
    b = Balancer()
    b.update({"r1": ["http://a", "http://b"]})
    a = b.replicas()[0]
    a.in_flight = 4
    a.mark_down("x")
    added = b.update({"r1": ["http://a"], "r2": ["http://b"]})
    assert b.replicas()[0] is a and a.in_flight == 4 and not a.healthy
    assert [(r.revision, r.url) for r in added] == [("r2", "http://b")]
