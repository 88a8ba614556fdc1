"""The router-scrape source: deltas between scrapes of each router pod, summed over pods, and what they
make the rollout do."""

from __future__ import annotations

import json
import random
from datetime import timedelta

import pytest

from folio.operator.analysis.router_scrape import RouterScrapes
from folio.operator.rollout import RevisionFacts
from folio.operator.spec import AnalysisSpec
from tests.analysis.helpers import Router
from tests.rollout.helpers import T0, deployed, make_spec

SPEC = AnalysisSpec(minRequests=50, maxErrorRate=0.05, maxLatencyP99IncreaseMs=50, maxTimeToFirstTokenP95Ms=500)


def test_deltas_between_scrapes_summed_over_router_pods() -> None:
    pods = {"http://r1/metrics": Router(), "http://r2/metrics": Router()}
    scrapes = RouterScrapes("chat")
    for pod in pods.values():  # history from before the interval must not count
        for _ in range(500):
            pod.serve("canary", "500", 0.9)
    first = scrapes.sample({u: p.text() for u, p in pods.items()}, "canary", "stable", SPEC, T0)
    assert first.verdict == "Inconclusive" and first.requests == 0
    assert any("baseline" in reason for reason in first.reasons)

    rng = random.Random(1)
    for i, pod in enumerate(pods.values()):
        for _ in range(400):
            pod.serve("stable", "200", rng.uniform(0.090, 0.110))
        for n in range(60):
            code = "error" if n < 6 and i == 0 else "502" if n < 9 else "200"
            pod.serve("canary", code, rng.uniform(0.250, 0.300), ttft=rng.uniform(0.05, 0.1))
    second = scrapes.sample({u: p.text() for u, p in pods.items()}, "canary", "stable", SPEC, T0)
    assert second.requests == 120
    assert second.errors == 18  # pod 1: 6 connection errors + 3 502s; pod 2: 9 502s
    assert second.error_rate == pytest.approx(18 / 120)
    assert second.latency_p99_ms == pytest.approx(300, abs=5)
    assert second.stable_latency_p99_ms == pytest.approx(110, abs=5)
    assert second.ttft_p95_ms == pytest.approx(100, abs=5)
    assert second.verdict == "Fail"
    text = " ".join(second.reasons)
    assert "error rate 15.00% (18/120) exceeds maxErrorRate 5.00%" in text
    assert "above stable's" in text and "maxLatencyP99IncreaseMs 50" in text

    third = scrapes.sample({u: p.text() for u, p in pods.items()}, "canary", "stable", SPEC, T0)
    assert third.requests == 0 and third.verdict == "Inconclusive"


def test_timeouts_are_counted_apart_from_errors() -> None:
    pod, scrapes = Router(), RouterScrapes("chat")
    scrapes.sample({"http://r1/metrics": pod.text()}, "canary", "stable", SPEC, T0)  # the baseline
    for n in range(80):
        pod.serve("canary", "timeout" if n < 8 else "200", 0.1)
    sample = scrapes.sample({"http://r1/metrics": pod.text()}, "canary", "stable", SPEC, T0)
    assert (sample.requests, sample.errors, sample.timeouts) == (80, 0, 8)
    assert sample.verdict == "Fail"
    assert sample.reasons == ["timeout rate 10.00% (8/80) exceeds maxTimeoutRate 5.00% (requestTimeout 60s)"]


def test_a_restarted_router_pod_counts_from_zero_and_a_new_one_is_a_baseline() -> None:
    scrapes = RouterScrapes("chat")
    old = Router()
    for _ in range(300):
        old.serve("canary", "200", 0.1)
    for _ in range(5):
        old.serve("stable", "200", 0.1)
    scrapes.ingest({"pod-a": old.text()})
    restarted = Router()  # same address, counters reset
    for _ in range(80):
        restarted.serve("canary", "200", 0.1)
    for _ in range(12):  # more than before the restart: still all new
        restarted.serve("stable", "200", 0.1)
    newcomer = Router()
    for _ in range(1000):
        newcomer.serve("canary", "500", 0.1)
    window, notes = scrapes.ingest({"pod-a": restarted.text(), "pod-b": newcomer.text()})
    assert window["canary"].requests == 80 and window["canary"].errors == 0
    assert window["stable"].requests == 12
    assert notes == ["router pod-b scraped for the first time (baseline)"]
    _, notes = scrapes.ingest({"pod-a": "folio_router_requests_total{isvc=\"chat\" 1"})
    assert len(notes) == 1 and notes[0].startswith("unreadable metrics from router pod-a")


def test_router_errors_drive_a_rollback_within_failure_limit_intervals() -> None:
    """Scrapes of a router whose canary fails 30% of attempts, fed to the state machine each interval."""
    sim = deployed(make_spec("a"))
    stable = sim.rev
    sim.apply(make_spec("b"))
    canary = sim.rev
    sim.facts[canary] = RevisionFacts("ready", ready_replicas=1)
    sim.tick(1)
    assert sim.weights() == {stable: 90, canary: 10}
    router, scrapes = Router(), RouterScrapes("chat")
    spec = sim.spec.rollout.analysis
    interval = spec.interval_seconds
    scrapes.ingest({"pod": router.text()})
    started, n = sim.now, 0
    while sim.status.canary_revision == canary:
        for _ in range(90):
            router.serve(stable, "200", 0.1)
        for _ in range(10):
            n += 1
            router.serve(canary, "error" if n % 10 < 3 else "200", 0.1)
        now = sim.now + timedelta(seconds=interval)
        sim.tick(interval, analysis=scrapes.sample({"pod": router.text()}, canary, stable, spec, now))
        assert (sim.now - started).total_seconds() <= (spec.failure_limit + 1) * interval
    assert sim.status.phase == "RolledBack" and sim.weights() == {stable: 100}
    message = sim.status.failed_revisions[-1].message
    assert "error rate 30.00%" in message and "maxErrorRate 1.00%" in message
    json.dumps(sim.status.to_wire())  # the whole story fits in status
