"""Who gets traffic: decided here, written to ``status.traffic``, which every router follows.

Only the stable and the canary get any. The stable revision carries traffic once its weights are
verified and it is ready, and keeps it while it already serves; the canary gets its step's share,
never more, and only while it is ready now (verified weights, a ready replica, no crash loop): a
canary that loses its replicas mid-step gives its share back to stable at once.
"""

from __future__ import annotations

from folio.operator.rollout.state import Pass
from folio.operator.spec import TrafficTarget


def route(p: Pass) -> None:
    stable, canary, c = p.stable(), p.canary(), p.st.canary
    canary_weight = 0
    if canary is not None and c is not None and c.step_started_at is not None and p.ready_now(canary):
        canary_weight = p.spec.rollout.steps[c.step].weight
    if stable is None or not p.stable_serves():
        p.st.traffic = []  # the canary never gets more than its step's share
        canary_weight = 0
    elif canary_weight:
        p.st.traffic = [
            TrafficTarget(revision=stable.name, weight=100 - canary_weight),
            TrafficTarget(revision=p.st.canary_revision or "", weight=canary_weight),
        ]
    else:
        p.st.traffic = [TrafficTarget(revision=stable.name, weight=100)]
    if stable is not None and p.st.traffic and stable.name not in p.served:
        p.event("Normal", "Serving", f"revision {stable.name} is ready and receives traffic")
    if c is not None:
        c.weight = canary_weight
