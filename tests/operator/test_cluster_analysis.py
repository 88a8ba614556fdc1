"""Analysis samples from router pods found through the API, scraped over real HTTP.

kmock plays both sides: the API server listing the router pod, and that pod's /metrics.
"""

from __future__ import annotations

import asyncio
from typing import Any

import kmock
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from folio.operator.cluster_analysis import ClusterAnalysis
from folio.operator.kube import Kube
from folio.operator.planner import component_labels
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus, TrafficTarget

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class RouterMetrics:
    """What a router pod exports, with counters the test moves forward."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("folio_router_requests", "", ["isvc", "revision", "code"], registry=self.registry)
        self.duration = Histogram("folio_router_request_duration_seconds", "", ["isvc", "revision"],
                                  buckets=(0.05, 0.1, 0.5, 1.0), registry=self.registry)

    def serve(self, revision: str, ok: int, failed: int, seconds: float) -> None:
        for _ in range(ok):
            self.requests.labels("chat", revision, "200").inc()
            self.duration.labels("chat", revision).observe(seconds)
        for _ in range(failed):
            self.requests.labels("chat", revision, "503").inc()

    def text(self) -> bytes:
        return generate_latest(self.registry)


def router_pod(port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "chat-router-1", "namespace": "ml", "labels": component_labels("chat", "router")},
        "spec": {"containers": [{"name": "router", "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    }


async def test_samples_the_canary_from_router_pods(kmock: kmock.KubernetesEmulator) -> None:
    metrics = RouterMetrics()
    kmock["get /metrics"] << (lambda: metrics.text())
    kube = Kube.for_url(str(kmock.url))
    await asyncio.to_thread(kube.create, router_pod(kmock.url.port or 80))

    spec = InferenceServiceSpec.model_validate({
        "model": {"source": "hf://org/model", "revision": COMMIT},
        "rollout": {"analysis": {"interval": "1ms", "minRequests": 20, "maxErrorRate": 0.05}},
    })
    status = InferenceServiceStatus(stable_revision="r1", canary_revision="r2", traffic=[
        TrafficTarget(revision="r1", weight=90), TrafficTarget(revision="r2", weight=10)])
    analysis = ClusterAnalysis("chat", "ml")

    metrics.serve("r2", ok=500, failed=0, seconds=0.01)  # history before the first scrape: not counted
    first = await analysis.sample(kube, spec, status)
    assert first is not None and first.verdict == "Inconclusive"  # a first scrape is only a baseline

    metrics.serve("r1", ok=100, failed=0, seconds=0.01)
    metrics.serve("r2", ok=30, failed=10, seconds=0.01)
    await asyncio.sleep(0.01)
    sample = await analysis.sample(kube, spec, status)
    assert sample is not None
    assert (sample.requests, sample.errors, sample.verdict) == (40, 10, "Fail")
    assert any("error rate" in r for r in sample.reasons)

    metrics.serve("r2", ok=40, failed=0, seconds=0.01)
    await asyncio.sleep(0.01)
    sample = await analysis.sample(kube, spec, status)
    assert sample is not None and (sample.requests, sample.verdict) == (40, "Pass")


async def test_no_sample_without_a_canary_taking_traffic(kmock: kmock.KubernetesEmulator) -> None:
    metrics = RouterMetrics()
    kmock["get /metrics"] << (lambda: metrics.text())
    kube = Kube.for_url(str(kmock.url))
    await asyncio.to_thread(kube.create, router_pod(kmock.url.port or 80))
    spec = InferenceServiceSpec.model_validate({"model": {"source": "hf://org/model", "revision": COMMIT}})
    stable_only = InferenceServiceStatus(stable_revision="r1", traffic=[TrafficTarget(revision="r1", weight=100)])
    assert await ClusterAnalysis("chat", "ml").sample(kube, spec, stable_only) is None
