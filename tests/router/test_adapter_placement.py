"""Adapter-aware placement: a request under an adapter goes to the replicas holding it in memory (the engines'
``folio_engine_lora_resident``), with prefix affinity and bounded load among them; another replica, which reads
the adapter from disk first, only when every holder is loaded beyond the bound."""

from __future__ import annotations

from collections import Counter

from folio.engine.server.metrics import LORA_RESIDENT
from folio.operator.router.balancer import Balancer, Replica
from folio.operator.router.loadscrape import parse_resident

NOW = 100.0


def fleet(resident: dict[str, frozenset[str]]) -> tuple[Balancer, dict[str, Replica]]:
    b = Balancer(clock=lambda: NOW)
    b.update({"r1": [f"http://e{i}" for i in range(4)]})
    replicas = {r.url: r for r in b.replicas()}
    for url, names in resident.items():
        replicas[url].resident, replicas[url].scraped_at = names, NOW
    for r in replicas.values():
        r.scraped_at = NOW
    return b, replicas


def test_an_adapter_request_goes_to_a_replica_holding_it() -> None:
    b, replicas = fleet({"http://e1": frozenset({"sql@s1"}), "http://e3": frozenset({"sql@s1", "chat@c1"})})
    replicas["http://e0"].in_flight = replicas["http://e2"].in_flight = 2  # busy with other requests
    placed = Counter()
    for _ in range(4):
        r = b.pick("r1", adapter="sql@s1")
        assert r is not None
        r.in_flight += 1
        placed[r.url] += 1
    assert placed == {"http://e1": 2, "http://e3": 2}, "bounded load across the holders"
    assert b.pick("r1", adapter="chat@c1").url == "http://e3"  # type: ignore[union-attr]
    assert b.pick("r1", adapter="new@n1") is not None, "held nowhere: anywhere"


def test_prefix_affinity_holds_within_the_holders() -> None:
    b, _ = fleet({"http://e0": frozenset({"sql@s1"}), "http://e2": frozenset({"sql@s1"})})
    first = b.pick("r1", key="You are a SQL expert. " * 8, adapter="sql@s1")
    assert first is not None and first.url in ("http://e0", "http://e2")
    for _ in range(5):
        again = b.pick("r1", key="You are a SQL expert. " * 8, adapter="sql@s1")
        assert again is first


def test_a_replica_loads_the_adapter_only_when_every_holder_is_beyond_the_bound() -> None:
    b, replicas = fleet({"http://e0": frozenset({"sql@s1"})})
    for r in replicas.values():
        r.in_flight = 1
    # the bound over the pool, after one more request: ceil(1.25 · (4 + 1) / 4) = 2, which e0 keeps to
    assert b.pick("r1", adapter="sql@s1").url == "http://e0"  # type: ignore[union-attr]
    replicas["http://e0"].in_flight = 3  # ceil(1.25 · (6 + 1) / 4) = 3: e0 would be past it
    other = b.pick("r1", adapter="sql@s1")
    assert other is not None and other.url != "http://e0"


def test_a_stale_scrape_says_nothing_of_what_a_replica_holds() -> None:
    b, replicas = fleet({"http://e2": frozenset({"sql@s1"})})
    replicas["http://e2"].scraped_at = NOW - 60
    seen = {b.pick("r1", adapter="sql@s1").url for _ in range(8)}  # type: ignore[union-attr]
    assert len(seen) > 1, "no fresh holder: placed by load alone"


def test_resident_adapters_are_read_from_an_engines_metrics() -> None:
    text = "\n".join([
        f"# TYPE {LORA_RESIDENT} gauge",
        f'{LORA_RESIDENT}{{lora_name="sql@s1"}} 1.0',
        f'{LORA_RESIDENT}{{lora_name="acme/chat:v2@c1"}} 1.0',
        'vllm:num_requests_running{model_name="m"} 2.0',
    ])  # fmt: skip
    assert parse_resident(text) == {"sql@s1", "acme/chat:v2@c1"}
    assert parse_resident("vllm:num_requests_running 1.0") == frozenset()
