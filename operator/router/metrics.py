"""Router metrics, named and labelled (`metric_names`) exactly as the rollout analysis reads them.

Each router owns its registry, so several routers (tests, one process per InferenceService)
never share counters. Label children are cached: `labels()` is the costly part of an update.

Series live as long as their revision is in the router's config, and `SERIES_GRACE_S` after it left (so
that scrapes get its final counts): `retain` removes the rest, so that /metrics does not grow with the
history of revisions. A replica's ejected gauge goes as soon as the replica leaves the endpoints; its
ejection count stays with its revision, so that a replica ejected for dying, then gone from the
endpoints at once, still shows in it. A counter of a revision that comes back
starts from zero again, a reset Prometheus handles; nothing analyses a revision out of the config.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from itertools import accumulate
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.utils import floatToGoString

from folio.operator import metric_names as m
from folio.operator.router.usage import TenantUsage
from folio.operator.serving.router import OVERFLOW

# Fine enough to read a p99 anywhere from 5 ms (the added-latency budget) to 60 s (long generations).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
)  # fmt: skip


# seconds, canary minus primary: symmetric around 0
LATENCY_DIFFERENCE_BUCKETS = tuple(sorted({*(-b for b in (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)), 0.0,
                                          0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0}))


Adapter = tuple[str, str]  # (adapter, adapter revision) a request went to; NO_ADAPTER: the base model
NO_ADAPTER: Adapter = ("", "")

# How long a revision's series outlive its leaving the config: longer than any scrape interval (and an
# analysis interval), so that Prometheus and the analysis see its final counts before they go.
SERIES_GRACE_S = 600.0


class _Discarded:
    """Stands in for the child of a series that is gone: a late update (an attempt or a mirrored request that
    outlived its revision's removal) must not bring the series back."""

    def inc(self, amount: float = 1) -> None:
        pass

    def dec(self, amount: float = 1) -> None:
        pass

    def set(self, value: float) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


_DISCARDED = _Discarded()


class RouterMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, isvc: str, registry: CollectorRegistry | None = None,
                 buckets: tuple[float, ...] = LATENCY_BUCKETS, clock: Callable[[], float] = time.monotonic) -> None:
        self.isvc = isvc
        self.clock = clock
        self.series_grace_s = SERIES_GRACE_S
        self.registry = registry or CollectorRegistry()
        r = self.registry
        per_revision = [m.ISVC, m.REVISION]
        per_adapter = [*per_revision, m.ADAPTER, m.ADAPTER_REVISION]
        self.requests = Counter(
            m.REQUESTS,
            "Upstream attempts by revision, adapter and outcome (HTTP status, or 'error' before the first byte).",
            [*per_adapter, m.CODE],
            registry=r,
        )
        self.retries = Counter(
            m.RETRIES, "Requests sent again after a failed attempt.", [m.ISVC, "from_revision", "to_revision"],
            registry=r,
        )
        self.duration = Histogram(
            m.DURATION, "Upstream attempt duration, request sent to last byte relayed.", per_adapter,
            buckets=buckets, registry=r,
        )
        self.ttft = Histogram(
            m.TTFT, "Request sent to the first body byte of the upstream's answer.", per_adapter,
            buckets=buckets, registry=r,
        )
        self.weight = Gauge(m.WEIGHT, "Traffic weight in use.", per_revision, registry=r)
        self.shadow = Counter(
            m.SHADOW_REQUESTS, "Mirrored requests by revision and outcome; their replies are discarded.",
            [*per_revision, m.CODE], registry=r,
        )
        self.shadow_duration = Histogram(
            m.SHADOW_DURATION, "Duration of mirrored requests.", per_revision, buckets=buckets, registry=r
        )
        self.shadow_comparisons = Counter(
            m.SHADOW_COMPARISONS, "Reproducible mirrored requests: the canary's answer against the primary's.",
            [*per_revision, m.RESULT], registry=r,
        )
        self.shadow_latency_difference = Histogram(
            m.SHADOW_LATENCY_DIFFERENCE, "Mirrored request duration, canary minus primary.", per_revision,
            buckets=LATENCY_DIFFERENCE_BUCKETS, registry=r,
        )
        self.in_flight = Gauge(m.IN_FLIGHT, "Upstream attempts in progress.", per_revision, registry=r)
        per_replica = [*per_revision, m.REPLICA]
        self.ejections = Counter(m.EJECTIONS, "Replicas taken out of rotation by outlier detection.", per_replica,
                                 registry=r)
        self.ejected = Gauge(m.EJECTED, "1 while a replica is ejected by outlier detection.", per_replica,
                             registry=r)
        self.overflow = Counter(
            m.OVERFLOW_REQUESTS, "Requests forwarded to the overflow endpoint, by its answer.", [m.ISVC, m.CODE],
            registry=r,
        )
        self.prefix_affinity = Counter(
            m.PREFIX_AFFINITY,
            "Requests placed by prefix or session affinity: where the key's prefix should be cached (hit), passed "
            "on from there for load (spill), or new to the router, so placed by load (new).",
            [*per_revision, m.RESULT], registry=r,
        )  # fmt: skip
        self.held = Gauge(m.HELD, "Requests held until a replica is ready (scale from zero).", [m.ISVC], registry=r)
        self.held_total = Counter(
            m.HELD_TOTAL, "Held requests by how their hold ended: served, timeout, full (queue) or gone (client).",
            [m.ISVC, m.OUTCOME], registry=r,
        )
        self.migrations = Counter(
            m.MIGRATIONS,
            "Answers whose replica failed after the first byte, by the revision that failed, why (reset, timeout, "
            "engine_error) and what followed (continued elsewhere, failed, no_replica).",
            [*per_revision, m.REASON, m.OUTCOME], registry=r,
        )  # fmt: skip
        self.migration_gap = Histogram(
            m.MIGRATION_GAP,
            "A continued answer's seam as its client saw it: last byte before the failure to first byte after.",
            per_revision, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self._children: dict[tuple[Any, ...], Any] = {}  # (id(metric), *labels after isvc) -> child
        self._weights: set[str] = set()
        # what `retain` keeps (None: everything, until a config arrives)
        self._revisions: set[str] | None = None
        self._replicas: set[tuple[str, str]] | None = None
        self._leaving: dict[str, float] = {}  # revisions out of the config -> since when (`clock`)
        # Tenants' series are rendered at scrape time from plain counts (`usage`): every tenant's request
        # updates them, and a prometheus_client update (a lock, a label lookup) costs more than it adds.
        self.tenants = TenantUsage(LATENCY_BUCKETS)
        r.register(_TenantCollector(isvc, self.tenants))
        self._metrics = {id(metric): metric for metric in vars(self).values() if isinstance(metric, MetricWrapperBase)}

    def _child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            if not self._kept(metric, labels):
                return _DISCARDED
            child = self._children[key] = metric.labels(self.isvc, *labels)
        return child

    def _kept(self, metric: MetricWrapperBase, labels: tuple[str, ...]) -> bool:
        """Whether the series may exist: every revision it names (the first label; a retry's two) is in the
        config or left it lately, and the replica of an ejected gauge is in the config."""
        revisions, replicas, leaving = self._revisions, self._replicas, self._leaving
        if revisions is None or replicas is None:
            return True
        names = labels[:2] if metric is self.retries else labels[:1]
        if any(name not in revisions and name not in leaving and name != OVERFLOW for name in names):
            return False
        return metric is not self.ejected or (labels[0], labels[1]) in replicas

    def retain(self, revisions: Collection[str], replicas: Collection[tuple[str, str]]) -> None:
        """Follow a new config's ``revisions`` and (revision, replica URL) ``replicas``: the series of a
        revision that left it go `series_grace_s` later, an ejected gauge of a replica that left it now;
        gone, they do not come back until they are in a config again."""
        revisions = set(revisions)
        now = self.clock()
        for gone in (self._revisions or set()) - revisions:
            self._leaving.setdefault(gone, now)
        for back in revisions & self._leaving.keys():
            del self._leaving[back]
        self._revisions, self._replicas = revisions, set(replicas)
        self._expire(now)
        self._sweep()

    def _expire(self, now: float) -> bool:
        """Forget the revisions whose grace is over; whether there were any."""
        expired = [r for r, since in self._leaving.items() if now - since >= self.series_grace_s]
        for revision in expired:
            del self._leaving[revision]
        return bool(expired)

    def _sweep(self) -> None:
        """Remove every series `_kept` no longer allows."""
        for key in [key for key in self._children if not self._kept(self._metrics[key[0]], key[1:])]:
            del self._children[key]
            self._metrics[key[0]].remove(self.isvc, *key[1:])

    def attempt_started(self, revision: str) -> None:
        self._child(self.in_flight, revision).inc()

    def attempt_finished(self, revision: str, code: str, duration: float | None, adapter: Adapter = NO_ADAPTER) -> None:
        self._child(self.in_flight, revision).dec()
        self._child(self.requests, revision, *adapter, code).inc()
        if duration is not None:
            self._child(self.duration, revision, *adapter).observe(duration)

    def attempt_abandoned(self, revision: str) -> None:
        self._child(self.in_flight, revision).dec()

    def first_byte(self, revision: str, seconds: float, adapter: Adapter = NO_ADAPTER) -> None:
        self._child(self.ttft, revision, *adapter).observe(seconds)

    def retry(self, from_revision: str, to_revision: str) -> None:
        self._child(self.retries, from_revision, to_revision).inc()

    def migrated(self, revision: str, reason: str, outcome: str) -> None:
        self._child(self.migrations, revision, reason, outcome).inc()

    def seam_gap(self, revision: str, seconds: float) -> None:
        self._child(self.migration_gap, revision).observe(seconds)

    def replica_ejected(self, revision: str, replica: str, ejected: bool) -> None:
        if ejected:
            self._child(self.ejections, revision, replica).inc()
        self._child(self.ejected, revision, replica).set(1 if ejected else 0)

    def affinity(self, revision: str, result: str) -> None:
        self._child(self.prefix_affinity, revision, result).inc()

    def overflowed(self, code: str) -> None:
        self.overflow.labels(self.isvc, code).inc()

    def shadowed(self, revision: str, code: str, duration: float) -> None:
        self._child(self.shadow, revision, code).inc()
        self._child(self.shadow_duration, revision).observe(duration)

    def shadow_compared(self, revision: str, result: str, difference: float | None) -> None:
        self._child(self.shadow_comparisons, revision, result).inc()
        if difference is not None:
            self._child(self.shadow_latency_difference, revision).observe(difference)

    def set_weights(self, weights: Mapping[str, int]) -> None:
        for gone in self._weights - weights.keys():
            if self._children.pop((id(self.weight), gone), None) is not None:  # else `retain` removed it
                self.weight.remove(self.isvc, gone)
        for revision, w in weights.items():
            self._child(self.weight, revision).set(w)
        self._weights = set(weights)

    def render(self) -> bytes:
        if self._leaving and self._expire(self.clock()):
            self._sweep()
        return generate_latest(self.registry)


class _TenantCollector:
    """The `folio_router_tenant_*` families, from the tenants' `usage.Ledger`s."""

    def __init__(self, isvc: str, usage: TenantUsage) -> None:
        self.isvc, self.usage = isvc, usage

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> list[Metric]:
        families = self._families()
        requests, tokens, queue, shed = families
        bounds = [*(floatToGoString(b) for b in self.usage.buckets), "+Inf"]
        for tenant, ledger in self.usage.ledgers.items():
            for code, n in ledger.codes.items():
                requests.add_metric([self.isvc, tenant, code], n)
            if ledger.codes:
                tokens.add_metric([self.isvc, tenant, "prompt"], ledger.prompt_tokens)
                tokens.add_metric([self.isvc, tenant, "completion"], ledger.completion_tokens)
            if any(ledger.queue_counts):
                queue.add_metric([self.isvc, tenant], list(zip(bounds, accumulate(ledger.queue_counts), strict=True)),
                                 ledger.queue_sum)  # fmt: skip
            for reason, n in ledger.shed.items():
                shed.add_metric([self.isvc, tenant, reason], n)
        return families

    @staticmethod
    def _families() -> list[Metric]:
        return [
            CounterMetricFamily(m.TENANT_REQUESTS, "Requests per tenant, by the HTTP status of their answer.",
                                labels=[m.ISVC, m.TENANT, m.CODE]),
            CounterMetricFamily(m.TENANT_TOKENS, "Tokens per tenant, prompt and completion.",
                                labels=[m.ISVC, m.TENANT, m.KIND]),
            HistogramMetricFamily(m.TENANT_QUEUE, "How long tenants' requests waited in the router for the "
                                  "saturated replicas.", labels=[m.ISVC, m.TENANT]),
            CounterMetricFamily(m.TENANT_SHED, "Tenants' requests shed while the replicas were saturated (503), by "
                                "why: full, displaced (by a higher priority) or timeout.",
                                labels=[m.ISVC, m.TENANT, m.REASON]),
        ]  # fmt: skip
