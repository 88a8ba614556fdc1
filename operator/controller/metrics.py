"""The operator's own Prometheus metrics, served on its `/metrics` port."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

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

POLICY_SERVICES = Gauge(
    "folio_rollout_policy_services",
    "InferenceServices a RolloutPolicy governs, by their phase in its rollout (Idle, Pending, Admitted, Running, "
    "Promoted, RolledBack, Conflict).",
    ["namespace", "policy", "phase"],
)
POLICY_HALTED = Gauge(
    "folio_rollout_policy_halted",
    "1 while a RolloutPolicy is halted (its Halted condition is True: no new canary starts until it is resumed).",
    ["namespace", "policy"],
)
SERVICE_PHASES = ("Idle", "Pending", "Admitted", "Running", "Promoted", "RolledBack", "Conflict")


def set_policy(namespace: str, policy: str, phases: dict[str, int], halted: bool) -> None:
    for phase in SERVICE_PHASES:
        POLICY_SERVICES.labels(namespace, policy, phase).set(phases.get(phase, 0))
    POLICY_HALTED.labels(namespace, policy).set(1 if halted else 0)


def forget_policy(namespace: str, policy: str) -> None:
    for phase in SERVICE_PHASES:
        with contextlib.suppress(KeyError):
            POLICY_SERVICES.remove(namespace, policy, phase)
    with contextlib.suppress(KeyError):
        POLICY_HALTED.remove(namespace, policy)


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
