"""Phase and the four conditions, with their messages: decided here, from the state after a pass.

Conditions follow the Kubernetes conventions (`metav1.Condition`): ``lastTransitionTime`` moves
only when a condition's status flips; reason, message and ``observedGeneration`` are refreshed on
every write. That keeps `kubectl wait --for=condition=Ready` and "since when" questions honest
while messages stay current. `invalid_spec` is the same for a spec that cannot be rolled out.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from folio.operator.parity import gate as parity_gate
from folio.operator.spec import (
    AnalysisSample,
    CanaryStatus,
    Condition,
    ConditionStatus,
    FailedRevision,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RevisionStatus,
    as_utc,
    now_iso,
)

if TYPE_CHECKING:
    from folio.operator.rollout.state import Pass

# The order in which conditions are listed in status, so a rewrite never reshuffles them.
CONDITION_ORDER = ("Ready", "Progressing", "Degraded", "WeightsReady")

ConditionValue = tuple[str, ConditionStatus, str, str]  # type, status, reason, message
# Progressing's reason while a RolloutPolicy holds the spec's new revision before its canary.
WAITING_FOR_POLICY = "WaitingForRolloutPolicy"


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: datetime,
) -> list[Condition]:
    """Return ``conditions`` with ``type_`` set; the transition time changes only on a status flip."""
    old = next((c for c in conditions if c.type == type_), None)
    changed = old is None or old.status != status or old.last_transition_time is None
    new = Condition(
        type=type_,
        status=status,
        reason=reason,
        message=message,
        observed_generation=generation,
        last_transition_time=now_iso(as_utc(now)) if changed else old.last_transition_time,
    )
    rest = [c for c in conditions if c.type != type_]
    return sorted([*rest, new], key=_order)


def _order(c: Condition) -> tuple[int, str]:
    rank = CONDITION_ORDER.index(c.type) if c.type in CONDITION_ORDER else len(CONDITION_ORDER)
    return rank, c.type


# ----------------------------------------------------------------------- after a pass


def summarize(p: Pass) -> None:
    """Phase (a human summary) and the four conditions of the state the pass arrived at."""
    st, target = p.st, p.target
    stable, canary = p.stable(), p.canary()
    failed = p.failed(target)
    serving = bool(st.traffic) and stable is not None
    pending = st.revision(target)

    if failed is not None:
        phase = "Failed" if failed.reason == "WeightsFailed" or not serving else "RolledBack"
    elif canary is not None:
        phase = "Paused" if st.canary is not None and st.canary.paused else (
            "Canary" if canary.weights_ready else "WeightsPending")
    elif serving and stable is not None and stable.name == target:
        phase = "Promoted" if p.promoted or p.previous_phase == "Promoted" else "Ready"
    elif pending is not None and not pending.weights_ready:
        phase = "WeightsPending"
    else:
        phase = "Pending"
    st.phase = phase

    gate_error = parity_gate.degraded(st)
    # a child whose kind the cluster does not serve (its CRD is absent): the service runs without it
    missing = p.observed.unavailable[0] if p.observed.unavailable else None
    before = st.condition("Degraded")
    for value in (
        _ready(stable, serving, scaled_to_zero(p)),
        _progressing(p, failed, canary, stable, serving),
        ("Degraded", "True", failed.reason, failed.message) if failed is not None
        else ("Degraded", "True", *gate_error) if gate_error is not None
        else ("Degraded", "True", *missing) if missing is not None
        else ("Degraded", "False", "AsExpected", "no failed revision"),
        _weights(p, failed, pending),
    ):
        st.conditions = set_condition(st.conditions, *value, generation=p.generation, now=p.now)
    after = st.condition("Degraded")
    if missing is not None and after is not None and after.reason == missing[0] and (
        before is None or before.status != "True" or before.reason != missing[0]
    ):  # once when it starts to show, not every pass
        p.event("Warning", *missing)


def scaled_to_zero(p: Pass) -> bool:
    """The autoscaler took the service to zero replicas (its routers hold requests while it scales up)."""
    auto = p.st.autoscaling
    return p.spec.autoscaling is not None and auto is not None and auto.desired_replicas == 0


def _ready(stable: RevisionStatus | None, serving: bool, zero: bool = False) -> ConditionValue:
    if serving and stable is not None:
        if stable.ready_replicas > 0:
            return "Ready", "True", "Serving", (
                f"stable revision {stable.name} serves with {stable.ready_replicas} ready replica(s)"
            )
        if zero:
            return "Ready", "True", "ScaledToZero", (
                f"stable revision {stable.name} is scaled to zero; requests are held while it scales up"
            )
        return "Ready", "False", "NoReadyReplicas", f"stable revision {stable.name} has no ready replica"
    if stable is None:
        return "Ready", "False", "NoRevision", "no revision can serve yet"
    if not stable.weights_ready:
        return "Ready", "False", "WeightsPending", f"waiting for the weights of revision {stable.name}"
    return "Ready", "False", "ReplicasPending", f"waiting for a ready replica of revision {stable.name}"


def _progressing(p: Pass, failed: FailedRevision | None, canary: RevisionStatus | None,
                 stable: RevisionStatus | None, serving: bool) -> ConditionValue:
    target = p.target
    if failed is not None:
        return "Progressing", "False", failed.reason, (
            f"revision {target} failed and is not retried until the spec changes or retry is asked"
        )
    if p.waiting is not None and canary is None:
        return "Progressing", "True", WAITING_FOR_POLICY, p.waiting
    if canary is not None and p.st.canary is not None:
        pause = p.st.canary.paused
        if pause is not None:  # held until someone acts: not progressing, not failed either
            return "Progressing", "False", pause.reason, pause.message
        return "Progressing", "True", *_canary_progress(p.spec, canary, p.st.canary)
    if stable is not None and stable.name == target and serving:
        return "Progressing", "False", "RolloutComplete", f"revision {target} is stable"
    if stable is not None and not stable.weights_ready:
        return "Progressing", "True", "WeightsPending", f"pre-pulling the weights of revision {target}"
    return "Progressing", "True", "ReplicasPending", f"waiting for a ready replica of revision {target}"


def _canary_progress(spec: InferenceServiceSpec, canary: RevisionStatus, c: CanaryStatus) -> tuple[str, str]:
    if not canary.weights_ready:
        return "WeightsPending", f"pre-pulling the weights of canary {canary.name}"
    gate = parity_gate.waiting(spec, canary, c)
    if gate is not None:
        return gate
    if c.step_started_at is None or c.weight == 0:
        return "ReplicasPending", f"waiting for a ready replica of canary {canary.name}"
    sample = describe_sample(c.last_analysis, spec) if c.last_analysis else "no analysis yet"
    return "CanaryStep", (
        f"canary {canary.name} at step {c.step + 1}/{len(spec.rollout.steps)} with {c.weight}% of traffic; "
        f"last analysis: {sample}"
    )


def _weights(p: Pass, failed: FailedRevision | None, pending: RevisionStatus | None) -> ConditionValue:
    if failed is not None and failed.reason == "WeightsFailed":
        return "WeightsReady", "False", "WeightsFailed", failed.message
    if pending is not None and pending.weights_ready:
        return "WeightsReady", "True", "Verified", f"weights of revision {p.target} are verified"
    if failed is not None:
        return "WeightsReady", "False", "NotPulled", f"revision {p.target} failed before its weights were verified"
    if p.waiting is not None and pending is None:
        return "WeightsReady", "False", WAITING_FOR_POLICY, (
            f"the weights of revision {p.target} are pulled once a RolloutPolicy admits its canary")
    facts = p.observed.revisions.get(p.target)
    detail = f": {facts.weights_message}" if facts and facts.weights_message else ""
    return "WeightsReady", "False", "Pulling", f"pre-pulling the weights of revision {p.target}{detail}"


# ------------------------------------------------------------------ an invalid spec


def invalid_spec(status: InferenceServiceStatus, reason: str, message: str, *, generation: int | None,
                 now: datetime) -> InferenceServiceStatus:
    """Degraded=True with the reason, Progressing=False: nothing is rolled out until the spec is fixed.

    Everything else in status stays as it is, so what already runs keeps running."""
    conditions = set_condition(status.conditions, "Degraded", "True", reason, message, generation=generation, now=now)
    conditions = set_condition(conditions, "Progressing", "False", reason,
                               "the spec cannot be rolled out until it is fixed", generation=generation, now=now)
    return status.model_copy(update={"conditions": conditions, "observed_generation": generation})


# -------------------------------------------------------------------------- messages


def describe_sample(sample: AnalysisSample, spec: InferenceServiceSpec) -> str:
    """One line with a sample's verdict, its figures and the thresholds they were held to."""
    a = spec.rollout.analysis
    parts = [
        f"{sample.requests} requests (min {a.min_requests})",
        f"error rate {sample.error_rate:.2%} (max {a.max_error_rate:.2%})",
    ]
    if sample.timeouts:
        parts.append(f"timeout rate {sample.timeout_rate:.2%} (max {a.max_timeout_rate:.2%})")
    if sample.latency_p99_ms is not None and sample.stable_latency_p99_ms is not None:
        diff = sample.latency_p99_ms - sample.stable_latency_p99_ms
        parts.append(
            f"p99 {sample.latency_p99_ms:.0f} ms vs stable {sample.stable_latency_p99_ms:.0f} ms "
            f"({diff:+.0f} ms, max +{a.max_latency_p99_increase_ms:.0f} ms)"
        )
    if sample.ttft_p95_ms is not None:
        parts.append(f"TTFT p95 {sample.ttft_p95_ms:.0f} ms (max {a.max_time_to_first_token_p95_ms:.0f} ms)")
    if sample.shadow_match_rate is not None:
        parts.append(f"shadow match {sample.shadow_match_rate:.1%}")
    figures = ", ".join(parts)
    why = f": {'; '.join(sample.reasons)}" if sample.reasons else ""
    return f"{sample.verdict}{why} [{figures}]"
