from __future__ import annotations

from collections import Counter

from folio.operator.router.balancer import Balancer
from folio.operator.router.ring import HashRing, key_hash


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


def _key(text: str) -> str:
    return "prefix\0" + text


def test_a_new_prefix_goes_to_the_least_loaded_and_comes_back_there() -> None:
    b = Balancer()
    b.update({"r1": ["http://a", "http://b", "http://c", "http://d"]})
    pool = b.pool("r1")
    counts = Counter[str]()
    for i in range(40):  # distinct prompts that never finish: least-loaded spread, whatever their owners
        replica = b.pick("r1", key=_key(f"distinct prompt {i}"))
        assert replica is not None
        replica.in_flight += 1
        counts[replica.url] += 1
    assert set(counts.values()) == {10}
    # the first request of a prefix went to the least loaded; the next ones meet its cache there
    pool[1].in_flight = 0
    home = b.pick("r1", key=_key("tenant 7's system prompt"))
    assert home is pool[1]
    home.in_flight += 1
    assert b.pick("r1", key=_key("tenant 7's system prompt")) is home  # 11 against 10s: under the bound


def test_results_say_new_hit_and_spill() -> None:
    b = Balancer()
    results: list[str] = []
    b.on_affinity = lambda revision, result: results.append(result)
    b.update({"r1": ["http://a", "http://b"]})
    home = b.pick("r1", key=_key("shared"))
    assert home is not None
    home.in_flight = 3  # ceil(1.25 x 4 / 2) = 3: no room for a fourth
    other = b.pick("r1", key=_key("shared"))
    assert other is not None and other is not home
    home.in_flight = 0
    assert b.pick("r1", key=_key("shared")) is home  # both hold it and idle: ring order, its owner
    assert results == ["new", "spill", "hit"]


def test_sessions_and_users_go_by_the_ring_from_their_first_request() -> None:
    b = Balancer()
    b.update({"r1": ["http://a", "http://b", "http://c", "http://d"]})
    pool = b.pool("r1")
    ring = HashRing(pool, lambda r: r.url)
    session = "session\0conversation-1"
    owner = ring.owner(key_hash(session))
    prefix = next(k for k in (_key(f"p{i}") for i in range(1000)) if ring.owner(key_hash(k)) is owner)
    idle = next(r for r in pool if r is not owner)
    for r in pool:
        r.in_flight = 0 if r is idle else 1  # the owner under the bound (ceil(1.25 x 4 / 4) = 2), not the idlest
    # a new prefix has no cache to meet: the idlest; a new session's later turns will need its first turn's
    # cache, and they go by the ring, so its first turn does too
    assert b.pick("r1", key=prefix) is idle
    assert b.pick("r1", key=session) is owner


def test_the_pool_forgets_keys_beyond_its_memory(monkeypatch: object) -> None:
    import folio.operator.router.balancer as balancer_module

    monkeypatch.setattr(balancer_module, "RECENT_KEYS", 3)  # type: ignore[attr-defined]
    b = Balancer()
    results: list[str] = []
    b.on_affinity = lambda revision, result: results.append(result)
    b.update({"r1": ["http://a", "http://b"]})
    for text in ("k0", "k1", "k0", "k2", "k3", "k1", "k0"):
        b.pick("r1", key=_key(text))
    # k0 was used again (most recent), so k1 went first when k3 came; k1 and then k0 are new once more
    assert results == ["new", "new", "hit", "new", "new", "new", "new"]
    b.update({"r1": ["http://a", "http://b", "http://c"]})  # a new replica: the memory stays
    b.pick("r1", key=_key("k0"))
    assert results[-1] == "hit"
