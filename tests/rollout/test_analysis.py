"""Analysis from real Prometheus text made by prometheus_client, and from a Prometheus HTTP API."""

from __future__ import annotations

import json
import random
from datetime import timedelta

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from folio.operator.analysis import (
    Figures,
    RouterScrapes,
    histogram_quantile,
    judge,
    parse_router_metrics,
    prometheus_sample,
    promql_queries,
)
from folio.operator.rollout import RevisionFacts
from folio.operator.spec import AnalysisSpec
from tests.rollout.helpers import T0, deployed, make_spec

BUCKETS = (*(round(0.005 * i, 3) for i in range(1, 200)), 2.0, 5.0, 10.0, 30.0, 60.0)
SPEC = AnalysisSpec(minRequests=50, maxErrorRate=0.05, maxLatencyP99IncreaseMs=50, maxTimeToFirstTokenP95Ms=500)


class Router:
    """One router pod's metrics, recorded with the real client library."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "folio_router_requests_total", "attempts", ["isvc", "revision", "code"], registry=self.registry
        )
        self.duration = Histogram(
            "folio_router_request_duration_seconds", "latency", ["isvc", "revision"],
            buckets=BUCKETS, registry=self.registry,
        )
        self.ttft = Histogram(
            "folio_router_time_to_first_token_seconds", "ttft", ["isvc", "revision"],
            buckets=BUCKETS, registry=self.registry,
        )

    def serve(self, revision: str, code: str, seconds: float, ttft: float | None = None, isvc: str = "chat") -> None:
        self.requests.labels(isvc, revision, code).inc()
        self.duration.labels(isvc, revision).observe(seconds)
        if ttft is not None:
            self.ttft.labels(isvc, revision).observe(ttft)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_parse_sums_codes_and_reads_buckets_for_one_service_only() -> None:
    r = Router()
    r.serve("c1", "200", 0.02)
    r.serve("c1", "503", 0.01)
    r.serve("c1", "error", 0.001)
    r.serve("c1", "404", 0.01)
    r.serve("other", "200", 0.02, isvc="another-service")
    snap = parse_router_metrics(r.text(), "chat")
    assert set(snap) == {"c1"}
    assert snap["c1"].requests == 4 and snap["c1"].errors == 2, "5xx and connection errors, not 4xx"
    assert snap["c1"].duration[float("inf")] == 4


def test_histogram_quantile_lands_in_the_true_quantiles_bucket() -> None:
    rng = random.Random(7)
    r = Router()
    values = sorted(rng.lognormvariate(-2.5, 0.6) for _ in range(5000))
    for v in values:
        r.serve("s", "200", v)
    buckets = parse_router_metrics(r.text(), "chat")["s"].duration
    for q in (0.5, 0.95, 0.99):
        true = values[int(q * len(values)) - 1]
        estimate = histogram_quantile(q, buckets)
        assert estimate is not None
        assert abs(estimate - true) <= 0.005 + 1e-9, (q, estimate, true)


def test_histogram_quantile_edge_cases() -> None:
    inf = float("inf")
    assert histogram_quantile(0.99, {}) is None
    assert histogram_quantile(0.99, {0.1: 0, inf: 0}) is None
    # everything beyond the last finite bound: the histogram can only say "at least 0.5"
    assert histogram_quantile(0.99, {0.1: 0, 0.5: 0, inf: 10}) == 0.5
    # halfway through the first bucket, interpolating from 0
    assert histogram_quantile(0.5, {0.1: 10, inf: 10}) == pytest.approx(0.05)


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


def test_verdicts_and_their_reasons() -> None:
    ok = Figures(requests=100, errors=1, latency_p99_ms=130, stable_latency_p99_ms=100, ttft_p95_ms=200)
    assert judge(ok, SPEC, T0).verdict == "Pass"
    few = Figures(requests=49, errors=49, latency_p99_ms=None, stable_latency_p99_ms=None, ttft_p95_ms=None)
    inconclusive = judge(few, SPEC, T0)
    assert inconclusive.verdict == "Inconclusive"
    assert inconclusive.reasons == ["only 49 canary requests in the interval (minRequests 50)"]
    slow_ttft = Figures(requests=100, errors=0, latency_p99_ms=100, stable_latency_p99_ms=100, ttft_p95_ms=800)
    failed = judge(slow_ttft, SPEC, T0)
    assert failed.verdict == "Fail"
    assert failed.reasons == ["TTFT p95 800 ms exceeds maxTimeToFirstTokenP95Ms 500"]
    assert failed.at == "2026-03-01T12:00:00Z"


def prometheus(answers: dict[str, object], seen: list[str]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        seen.append(query)
        for key, value in answers.items():
            if key in query:
                result = [] if value is None else [{"metric": {}, "value": [0, str(value)]}]
                return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})
        return httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "unexpected"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def test_prometheus_figures_and_verdict() -> None:
    seen: list[str] = []
    answers = {
        'code=~"5..|error"': 12,
        "histogram_quantile(0.99": 0.2,  # both canary and stable: no increase
        "histogram_quantile(0.95": 0.3,
        "folio_router_requests_total": 100,
    }
    async with prometheus(answers, seen) as client:
        sample = await prometheus_sample(client, "http://prom:9090", "chat", "c1", "s1", SPEC, T0)
    assert (sample.requests, sample.errors, sample.verdict) == (100, 12, "Fail")
    assert sample.latency_p99_ms == pytest.approx(200) and sample.ttft_p95_ms == pytest.approx(300)
    assert set(seen) == set(promql_queries("chat", "c1", "s1", "30s").values())
    assert all('isvc="chat"' in q and "[30s]" in q for q in seen)


async def test_prometheus_down_or_empty_is_inconclusive() -> None:
    async with prometheus({}, []) as client:
        sample = await prometheus_sample(client, "http://prom:9090", "chat", "c1", "s1", SPEC, T0)
    assert sample.verdict == "Inconclusive"
    assert "could not be queried" in sample.reasons[0]
    async with prometheus({"histogram_quantile": None, "folio_router_requests_total": None}, []) as client:
        sample = await prometheus_sample(client, "http://prom:9090", "chat", "c1", "s1", SPEC, T0)
    assert sample.verdict == "Inconclusive" and sample.latency_p99_ms is None


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
