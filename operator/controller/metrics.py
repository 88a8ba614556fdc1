"""The operator's own Prometheus metrics, served on its `/metrics` port."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

RECONCILES = Counter(
    "folio_operator_reconciles_total",
    "Reconciles of InferenceServices, by what triggered them and how they ended.",
    # trigger: create | update | resume (kopf), requeue (a decision came due), child (a child changed
    # or an override was asked), timer (the resync); result: ok | invalid | error | gone
    ["trigger", "result"],
)
ERRORS = Counter(
    "folio_operator_reconcile_errors_total",
    "Reconciles that failed and will be retried, by error kind.",
    ["reason"],
)
DURATION = Histogram(
    "folio_operator_reconcile_duration_seconds",
    "Wall time of one reconcile, API calls included.",
    ["trigger"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
APPLIED = Counter(
    "folio_operator_objects_total",
    "Child objects written by the operator, by kind and action.",
    ["kind", "action"],  # action: created | deleted
)
REVISIONS_FAILED = Counter(
    "folio_operator_revisions_failed_total",
    "Revisions the rollout failed (and rolled back when they had traffic), by failedRevisions[].reason.",
    ["namespace", "isvc", "reason"],
)


def forget_isvc(namespace: str, name: str) -> None:
    """Remove a deleted InferenceService's series, so that /metrics does not keep every one that ever was."""
    reasons = {
        sample.labels["reason"]
        for family in REVISIONS_FAILED.collect()
        for sample in family.samples
        if sample.labels.get("namespace") == namespace and sample.labels.get("isvc") == name
    }
    for reason in reasons:  # in REVISIONS_FAILED's label order
        REVISIONS_FAILED.remove(namespace, name, reason)
