"""The router's metric names: the contract DESIGN.md publishes, in the one module everything imports."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from folio.operator import metric_names as m
from folio.operator.router.metrics import RouterMetrics


def test_the_names_are_the_published_ones() -> None:
    assert (m.REQUESTS, m.DURATION, m.TTFT, m.WEIGHT) == (
        "folio_router_requests_total",
        "folio_router_request_duration_seconds",
        "folio_router_time_to_first_token_seconds",
        "folio_router_traffic_weight",
    )


def test_the_router_exports_every_name_with_its_labels() -> None:
    metrics = RouterMetrics("chat")
    metrics.attempt_started("r1")
    metrics.attempt_finished("r1", "503", 0.2)
    metrics.first_byte("r1", 0.1)
    metrics.retry("r1", "r2")
    metrics.shadowed("r2", "200", 0.1)
    metrics.set_weights({"r1": 100})
    samples = {s.name: s.labels for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}
    for name in (m.REQUESTS, f"{m.DURATION}_bucket", f"{m.TTFT}_bucket", m.WEIGHT, m.RETRIES, m.SHADOW_REQUESTS,
                 f"{m.SHADOW_DURATION}_bucket", m.IN_FLIGHT):
        assert name in samples, name
        assert samples[name][m.ISVC] == "chat"
    assert samples[m.REQUESTS] == {m.ISVC: "chat", m.REVISION: "r1", m.ADAPTER: "", m.ADAPTER_REVISION: "",
                                   m.CODE: "503"}
    metrics.affinity("r1", m.AFFINITY_SPILL)
    affinity = {s.name: s.labels for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples
                if s.name == m.PREFIX_AFFINITY}
    assert m.PREFIX_AFFINITY == "folio_router_prefix_affinity_total"
    assert affinity[m.PREFIX_AFFINITY] == {m.ISVC: "chat", m.REVISION: "r1", m.RESULT: m.AFFINITY_SPILL}
    assert m.is_error("503") and m.is_error("error") and not m.is_error("429") and not m.is_error("200")


def test_migration_series_carry_the_failed_revision_reason_and_outcome() -> None:
    assert (m.MIGRATIONS, m.MIGRATION_GAP) == ("folio_router_migrations_total", "folio_router_migration_gap_seconds")
    metrics = RouterMetrics("chat")
    metrics.retain(["r1"], [])
    metrics.migrated("r1", m.MIGRATION_TIMEOUT, m.MIGRATION_CONTINUED)
    metrics.seam_gap("r1", 0.002)
    metrics.migrated("gone", m.MIGRATION_RESET, m.MIGRATION_FAILED)  # a revision out of the config: no series
    samples = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(metrics.render().decode())
               for s in f.samples]  # fmt: skip
    assert (m.MIGRATIONS, {m.ISVC: "chat", m.REVISION: "r1", m.REASON: "timeout", m.OUTCOME: "continued"}, 1.0) \
        in samples  # fmt: skip
    assert (f"{m.MIGRATION_GAP}_count", {m.ISVC: "chat", m.REVISION: "r1"}, 1.0) in samples
    buckets = [float(labels["le"]) for name, labels, _ in samples if name == f"{m.MIGRATION_GAP}_bucket"]
    assert buckets[0] == 0.001 and 60.0 in buckets  # fine from a millisecond to a minute
    assert not any(labels.get(m.REVISION) == "gone" for _, labels, _ in samples)
