"""When and from where samples are taken: router pods scraped over real HTTP (kmock serves their /metrics)."""

from __future__ import annotations

from datetime import timedelta

import httpx
import kmock
import pytest

from folio.operator.analysis.sampler import IntervalSampler
from folio.operator.spec import AnalysisSpec, InferenceServiceStatus, TrafficTarget
from tests.analysis.helpers import Router
from tests.rollout.helpers import T0

SPEC = AnalysisSpec(interval="30s", minRequests=20, maxErrorRate=0.05)


def status(canary_weight: int) -> InferenceServiceStatus:
    traffic = [TrafficTarget(revision="r1", weight=100 - canary_weight)]
    if canary_weight:
        traffic.append(TrafficTarget(revision="r2", weight=canary_weight))
    return InferenceServiceStatus(stable_revision="r1", canary_revision="r2", traffic=traffic)


@pytest.fixture
def router(kmock: kmock.KubernetesEmulator) -> tuple[Router, str]:
    pod = Router()
    kmock["get /metrics"] << (lambda: pod.text().encode())
    return pod, f"{str(kmock.url).rstrip('/')}/metrics"


async def test_samples_the_canary_from_its_routers(router: tuple[Router, str]) -> None:
    pod, url = router
    sampler = IntervalSampler("chat")
    for _ in range(500):
        pod.serve("r2", "200", 0.01)  # history before the first scrape: not counted
    async with httpx.AsyncClient() as client:
        first = await sampler.take(client, [url], status=status(10), spec=SPEC, now=T0)
        assert first is not None and first.verdict == "Inconclusive"  # a first scrape is only a baseline
        for _ in range(100):
            pod.serve("r1", "200", 0.01)
        for n in range(40):
            pod.serve("r2", "503" if n < 10 else "200", 0.01)
        sample = await sampler.take(client, [url], status=status(10), spec=SPEC, now=T0 + timedelta(seconds=30))
        assert sample is not None and (sample.requests, sample.errors, sample.verdict) == (40, 10, "Fail")
        assert any("error rate" in r for r in sample.reasons)
        for _ in range(40):
            pod.serve("r2", "200", 0.01)
        sample = await sampler.take(client, [url], status=status(10), spec=SPEC, now=T0 + timedelta(seconds=60))
        assert sample is not None and (sample.requests, sample.verdict) == (40, "Pass")


async def test_the_baseline_moves_while_no_canary_takes_traffic(router: tuple[Router, str]) -> None:
    """Routers are scraped every interval even without a serving canary, so its first interval counts."""
    pod, url = router
    sampler = IntervalSampler("chat")
    async with httpx.AsyncClient() as client:
        assert await sampler.take(client, [url], status=status(0), spec=SPEC, now=T0) is None
        for _ in range(30):
            pod.serve("r2", "200", 0.01)  # e.g. shadow or retried traffic before its first step
        assert await sampler.take(client, [url], status=status(0), spec=SPEC, now=T0) is None
        for _ in range(25):
            pod.serve("r2", "200", 0.01)
        sample = await sampler.take(client, [url], status=status(10), spec=SPEC, now=T0)
    assert sample is not None and (sample.requests, sample.verdict) == (25, "Pass")


async def test_an_unreachable_router_is_named_and_never_a_pass() -> None:
    sampler = IntervalSampler("chat")
    async with httpx.AsyncClient() as client:
        sample = await sampler.take(client, ["http://127.0.0.1:1/metrics"], status=status(10), spec=SPEC, now=T0)
    assert sample is not None and sample.verdict == "Inconclusive"
    assert any("not scraped" in r for r in sample.reasons)


def test_one_sample_per_interval_on_the_caller_s_clock() -> None:
    sampler = IntervalSampler("chat")
    assert sampler.due(SPEC, T0)
    assert not sampler.due(SPEC, T0 + timedelta(seconds=29))
    assert sampler.due(SPEC, T0 + timedelta(seconds=30))
    assert not sampler.due(SPEC, T0 + timedelta(seconds=31))
    assert sampler.due(SPEC, T0), "a clock set back starts a new interval rather than none for a while"


def test_deadlines_are_a_whole_interval_apart_however_late_the_pass() -> None:
    sampler = IntervalSampler("chat")
    assert sampler.due(SPEC, T0) and sampler.until_due(T0) == 30.0
    assert sampler.due(SPEC, T0 + timedelta(seconds=30.7))  # a pass 0.7 s late...
    assert sampler.until_due(T0 + timedelta(seconds=30.7)) == pytest.approx(29.3)  # ...does not delay the next
    assert not sampler.due(SPEC, T0 + timedelta(seconds=59.9))
    assert sampler.due(SPEC, T0 + timedelta(seconds=60))
    assert sampler.due(SPEC, T0 + timedelta(seconds=200))  # more than an interval late: from now on
    assert sampler.until_due(T0 + timedelta(seconds=200)) == 30.0


def test_a_canary_s_samples_count_from_when_it_takes_traffic() -> None:
    sampler = IntervalSampler("chat")
    assert sampler.due(SPEC, T0)
    started = T0 + timedelta(seconds=12.5)
    sampler.restart(SPEC, status(0), started)  # still waiting for a ready replica: nothing moves
    assert sampler.until_due(started) == pytest.approx(17.5)
    sampler.restart(SPEC, status(10), started)  # the decision that gave it its first step's weight
    assert sampler.until_due(started) == 30.0
    assert sampler.requeue(60.0, status(10), started) == 30.0  # the clock wakes up for the sample
    assert sampler.requeue(5.0, status(10), started) == 5.0  # or sooner, when the decision asks
    assert sampler.requeue(60.0, status(0), started) == 60.0  # no serving canary: no sample to wait for
    sampler.restart(SPEC, status(10), started + timedelta(seconds=1))  # the same canary: no restart
    assert not sampler.due(SPEC, started + timedelta(seconds=29.9))
    assert sampler.due(SPEC, started + timedelta(seconds=30))
