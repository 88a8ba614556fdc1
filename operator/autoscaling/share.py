"""The autoscaler's replicas split over the running revisions: what the serving plan runs of each.

Without ``spec.autoscaling`` every running revision runs ``spec.replicas``, as before. With it the
service's ``status.autoscaling.desiredReplicas`` is shared by traffic: the canary gets its step's
share (at least one replica, so that it can be measured), stable the rest (at least one while it
has traffic). In the canary's last step it is brought to the whole count before it is promoted, and
`promotion_ready` holds the promotion until those replicas are ready: moving all traffic never
leaves less capacity than the load needs. A retiring revision keeps the replicas that serve its
last requests while it drains, and starts no new ones.
"""

from __future__ import annotations

import math

from folio.operator.autoscaling.decide import clamp, initial_replicas
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus, RevisionStatus


def service_replicas(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> int:
    """The replicas the whole service should have now."""
    auto = spec.autoscaling
    if auto is None:
        return spec.replicas
    if status.autoscaling is None or status.autoscaling.keda:  # KEDA's marker holds no decision of Folio's
        return initial_replicas(auto)
    return clamp(auto, status.autoscaling.desired_replicas)


def revision_replicas(spec: InferenceServiceSpec, status: InferenceServiceStatus, rev: RevisionStatus) -> int:
    if spec.autoscaling is None:
        return spec.replicas
    total = service_replicas(spec, status)
    if rev.role == "Retiring":
        return rev.ready_replicas
    canary = status.canary_revision
    weights = {t.revision: t.weight for t in status.traffic}
    if rev.role == "Canary":
        if in_last_step(spec, status):
            return max(1, total)
        return max(1, math.ceil(total * weights.get(rev.name, 0) / 100))
    canary_weight = weights.get(canary, 0) if canary else 0
    if not canary_weight:
        return total
    return max(1, math.ceil(total * (100 - canary_weight) / 100))


def in_last_step(spec: InferenceServiceSpec, status: InferenceServiceStatus) -> bool:
    c = status.canary
    return c is not None and c.step_started_at is not None and c.step >= len(spec.rollout.steps) - 1


def promotion_ready(spec: InferenceServiceSpec, status: InferenceServiceStatus, canary_ready: int) -> bool:
    """Whether the canary has the replicas the whole load needs (always, without autoscaling)."""
    return spec.autoscaling is None or canary_ready >= service_replicas(spec, status)
