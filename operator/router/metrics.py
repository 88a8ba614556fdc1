"""Router metrics, named and labelled exactly as the rollout analysis reads them.

Each router owns its registry, so several routers (tests, one process per InferenceService)
never share counters. Label children are cached: `labels()` is the costly part of an update.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics import MetricWrapperBase

# Fine enough to read a p99 anywhere from 5 ms (the added-latency budget) to 60 s (long generations).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
)  # fmt: skip


class RouterMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, isvc: str, registry: CollectorRegistry | None = None) -> None:
        self.isvc = isvc
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "folio_router_requests_total",
            "Upstream attempts by revision and outcome (HTTP status, or 'error' before the first byte).",
            ["isvc", "revision", "code"],
            registry=r,
        )
        self.retries = Counter(
            "folio_router_retries_total",
            "Requests sent again after a failed attempt.",
            ["isvc", "from_revision", "to_revision"],
            registry=r,
        )
        self.duration = Histogram(
            "folio_router_request_duration_seconds",
            "Upstream attempt duration, request sent to last byte relayed.",
            ["isvc", "revision"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "folio_router_time_to_first_token_seconds",
            "Request sent to the first body byte of the upstream's answer.",
            ["isvc", "revision"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.weight = Gauge(
            "folio_router_traffic_weight", "Traffic weight in use.", ["isvc", "revision"], registry=r
        )
        self.shadow = Counter(
            "folio_router_shadow_requests_total",
            "Mirrored requests by revision and outcome; their replies are discarded.",
            ["isvc", "revision", "code"],
            registry=r,
        )
        self.shadow_duration = Histogram(
            "folio_router_shadow_request_duration_seconds",
            "Duration of mirrored requests.",
            ["isvc", "revision"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "folio_router_in_flight", "Upstream attempts in progress.", ["isvc", "revision"], registry=r
        )
        self._children: dict[tuple[object, ...], Any] = {}
        self._weights: set[str] = set()

    def _child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.isvc, *labels)
        return child

    def attempt_started(self, revision: str) -> None:
        self._child(self.in_flight, revision).inc()

    def attempt_finished(self, revision: str, code: str, duration: float | None) -> None:
        self._child(self.in_flight, revision).dec()
        self._child(self.requests, revision, code).inc()
        if duration is not None:
            self._child(self.duration, revision).observe(duration)

    def attempt_abandoned(self, revision: str) -> None:
        self._child(self.in_flight, revision).dec()

    def first_byte(self, revision: str, seconds: float) -> None:
        self._child(self.ttft, revision).observe(seconds)

    def retry(self, from_revision: str, to_revision: str) -> None:
        self._child(self.retries, from_revision, to_revision).inc()

    def shadowed(self, revision: str, code: str, duration: float) -> None:
        self._child(self.shadow, revision, code).inc()
        self._child(self.shadow_duration, revision).observe(duration)

    def set_weights(self, weights: Mapping[str, int]) -> None:
        for gone in self._weights - weights.keys():
            self.weight.remove(self.isvc, gone)
            self._children.pop((id(self.weight), gone), None)
        for revision, w in weights.items():
            self._child(self.weight, revision).set(w)
        self._weights = set(weights)

    def render(self) -> bytes:
        return generate_latest(self.registry)
