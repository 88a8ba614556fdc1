"""The RolloutPolicy state machine: pure, deterministic, driven by statuses alone.

``decide(name, spec, generation, status, services, now, resume=…)`` reads the policy's spec, the status
its last pass wrote and what every InferenceService of the namespace says of itself (`ServiceView`: its
labels, its spec's revision, its stable and canary revisions, its failed revisions), and answers the
policy's next status: each governed service's phase, which ones may start their canary now (``Admitted``)
and the conditions. It does no I/O and keeps nothing in memory: a restarted or failed-over operator
carries on from the statuses.

The rules (docs/rollouts.md, "Fleet rollouts"):

- A governed service whose spec names a revision that is neither its stable one, nor its canary, nor a
  failed one *waits* (Pending) until the policy admits it; a first revision (nothing serves yet) is not
  gated: it risks no user's traffic.
- Admitted plus Running (a canary in progress, paused or not, admitted or not) is never more than
  ``maxConcurrent`` after a pass that admits (a pass never admits beyond it).
- Waves go in ``spec.waves`` order by the ``folio.dev/wave`` label; services without it (or with a label
  no wave names) form the last wave. Only the earliest wave with a service not done admits. A wave is done
  when none of its services is Pending, Admitted or Running; the next one starts ``soak`` after its last
  promotion, and only if none of its services rolled back since the policy was last resumed.
- Rollbacks (a governed service's spec revision listed in its ``failedRevisions``) at or after
  ``resumedAt`` count against ``failureBudget``; once they reach it, nothing new is admitted (admissions
  not yet started are taken back) and ``Halted=True`` names the failed services and their reasons.
  Running canaries finish on their own evidence. A resume (`folio fleet resume`, or a new value of the
  ``folio.dev/resume-at`` annotation) sets ``resumedAt`` to now.
- A service two policies select is a planning error (``Ready=False``, reason ``SelectedTwice``) in both
  policies' statuses, and is never admitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from folio.operator.fleet.model import (
    WAVE_LABEL,
    PolicyPhase,
    PolicyService,
    RolledBack,
    RolloutPolicySpec,
    RolloutPolicyStatus,
    ServicePhase,
)
from folio.operator.spec import Condition, ConditionStatus, as_utc, now_iso, parse_time

IN_FLIGHT: tuple[ServicePhase, ...] = ("Admitted", "Running")  # what counts against maxConcurrent
NOT_DONE: tuple[ServicePhase, ...] = ("Pending", "Admitted", "Running")


@dataclass(frozen=True)
class Failure:
    revision: str
    reason: str
    at: str | None = None
    message: str = ""


@dataclass(frozen=True)
class ServiceView:
    """What an InferenceService's own object says (its labels, spec and status), as the policy reads it."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    target: str | None = None  # its spec's revision; None: a spec that cannot be read
    stable: str | None = None
    canary: str | None = None  # a canary in progress (paused or not)
    failed: tuple[Failure, ...] = ()
    policies: frozenset[str] = frozenset()  # every policy of the namespace that selects it (this one included)


@dataclass
class PolicyEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class PolicyDecision:
    status: RolloutPolicyStatus
    events: list[PolicyEvent] = field(default_factory=list)
    requeue_after: float | None = None  # a soak ending

    @property
    def admitted(self) -> frozenset[str]:
        return frozenset(s.name for s in self.status.services if s.phase == "Admitted")


def set_condition(conditions: list[Condition], type_: str, status: ConditionStatus, reason: str, message: str, *,
                  generation: int | None, now: datetime) -> list[Condition]:
    """``conditions`` with ``type_`` set (Ready, then Halted); the transition time moves only on a status flip
    (as `folio.operator.rollout.conditions.set_condition` does for an InferenceService's)."""
    old = next((c for c in conditions if c.type == type_), None)
    changed = old is None or old.status != status or old.last_transition_time is None
    new = Condition(type=type_, status=status, reason=reason, message=message, observed_generation=generation,
                    last_transition_time=now_iso(as_utc(now)) if changed or old is None else old.last_transition_time)
    order = ("Ready", "Halted")
    return sorted([*(c for c in conditions if c.type != type_), new],
                  key=lambda c: (order.index(c.type) if c.type in order else len(order), c.type))


def wave_index(spec: RolloutPolicySpec, labels: Mapping[str, str]) -> int:
    """A service's wave: the index of its ``folio.dev/wave`` label in ``spec.waves``; the last one without."""
    label = labels.get(WAVE_LABEL)
    for i, wave in enumerate(spec.waves):
        if wave.label == label:
            return i
    return len(spec.waves)


def _wave_label(spec: RolloutPolicySpec, index: int | None) -> str | None:
    return spec.waves[index].label if index is not None and index < len(spec.waves) else None


def _phase(view: ServiceView, previous: PolicyService | None) -> ServicePhase:
    if len(view.policies) > 1:
        return "Conflict"
    target = view.target
    if target is None:
        return "Idle"
    if any(f.revision == target for f in view.failed) and view.canary != target:
        return "RolledBack"
    if view.canary is not None:
        return "Running"
    if view.stable is None:
        return "Idle"  # the first revision goes straight to stable: no traffic to protect
    was = previous.phase if previous is not None and previous.revision == target else None
    if target == view.stable:
        return "Promoted" if was in ("Admitted", "Running", "Promoted") else "Idle"
    return "Admitted" if was in IN_FLIGHT else "Pending"


def _counted(failure: Failure | None, resumed_at: str | None) -> bool:
    """Whether a rollback counts against the budget: it came at or after the last resume."""
    if failure is None:
        return False
    if resumed_at is None or failure.at is None:
        return True
    return parse_time(failure.at) >= parse_time(resumed_at)


def decide(
    name: str,
    spec: RolloutPolicySpec,
    generation: int | None,
    status: RolloutPolicyStatus,
    services: Sequence[ServiceView],
    now: datetime,
    *,
    resume: str | None = None,
) -> PolicyDecision:
    """The policy's next status from its spec, its last status and the services of its namespace.

    ``services`` may hold services the selector does not match (they are left out: released);
    ``resume``: the ``folio.dev/resume-at`` annotation's value, acted on when it differs from ``resumedBy``.
    """
    at = now_iso(now)
    prev = status
    st = RolloutPolicyStatus(resumed_at=prev.resumed_at or at, resumed_by=prev.resumed_by,
                             conditions=list(prev.conditions), observed_generation=generation)
    d = PolicyDecision(st)
    if resume and resume != prev.resumed_by:
        st.resumed_at, st.resumed_by = at, resume
        d.events.append(PolicyEvent("Normal", "Resumed", f"failure budget reset by resume {resume!r}"))

    governed = sorted((v for v in services if spec.selector.matches(dict(v.labels))), key=lambda v: v.name)
    rows: dict[str, PolicyService] = {}
    failures: dict[str, Failure] = {}
    waves: dict[str, int] = {}
    for view in governed:
        before = prev.service(view.name)
        phase = _phase(view, before)
        same = before is not None and before.phase == phase and before.revision == view.target
        rows[view.name] = PolicyService(name=view.name, wave=view.labels.get(WAVE_LABEL), phase=phase,
                                        revision=view.target, since=before.since if same and before else at)
        waves[view.name] = wave_index(spec, view.labels)
        if phase == "RolledBack":
            failures[view.name] = next(f for f in reversed(view.failed) if f.revision == view.target)

    counted = sorted(n for n, f in failures.items() if _counted(f, st.resumed_at))
    spent = len(counted) >= spec.failure_budget

    # The wave that admits now: the earliest with a service not done; a done wave with a counted rollback,
    # or whose soak has not passed, stops the walk.
    current: int | None = None
    wave_failed: int | None = None
    soak_until: datetime | None = None
    for w in range(len(spec.waves) + 1):
        members = [r for n, r in rows.items() if waves[n] == w]
        if any(r.phase in NOT_DONE for r in members):
            current = w
            break
        later = [r for n, r in rows.items() if waves[n] > w and r.phase in NOT_DONE]
        if not later:
            break  # nothing waits behind it
        if any(r.name in counted for r in members):
            wave_failed = w
            break
        promoted = [parse_time(r.since) for r in members if r.phase == "Promoted" and r.since]
        if promoted and w < len(spec.waves):
            until = max(promoted) + timedelta(seconds=spec.waves[w].soak_seconds)
            if until > now:
                soak_until, current = until, w
                break

    halted = spent or wave_failed is not None
    in_flight = sum(r.phase in IN_FLIGHT for r in rows.values())
    if halted:
        for r in rows.values():
            if r.phase == "Admitted":  # not started yet: nothing new starts once halted
                r.phase, r.since = "Pending", at
                d.events.append(PolicyEvent("Warning", "AdmissionWithdrawn",
                                            f"{r.name}: its canary had not started; it waits on stable"))
    elif soak_until is None and current is not None:
        for n, r in rows.items():
            if in_flight >= spec.max_concurrent:
                break
            if waves[n] == current and r.phase == "Pending":
                r.phase, r.since = "Admitted", at
                in_flight += 1
                d.events.append(PolicyEvent("Normal", "CanaryAdmitted",
                                            f"{n} may start the canary of revision {r.revision} "
                                            f"(wave {_wave_label(spec, current) or 'unlabelled'})"))

    st.services = list(rows.values())
    st.running = [n for n, r in rows.items() if r.phase in IN_FLIGHT]
    st.pending = [n for n, r in rows.items() if r.phase == "Pending"]
    st.promoted = [n for n, r in rows.items() if r.phase == "Promoted"]
    st.rolled_back = [RolledBack(name=n, revision=f.revision, reason=f.reason, at=f.at, message=f.message)
                      for n, f in sorted(failures.items())]
    phase: PolicyPhase
    if halted:
        phase = "Halted"
    elif soak_until is not None:
        phase, st.soak_until = "Soaking", now_iso(soak_until)
        d.requeue_after = max(1.0, (soak_until - now).total_seconds())
    elif st.running or st.pending:
        phase = "Progressing"
    else:
        phase = "Idle"
    st.phase = phase
    shown = wave_failed if wave_failed is not None else current
    st.wave = _wave_label(spec, shown) if shown is not None else None

    conflicts = [n for n, r in rows.items() if r.phase == "Conflict"]
    conflict_views = {v.name: v for v in governed if v.name in conflicts}
    halted_value = _halted(spec, failures, counted, spent, wave_failed)
    ready_value: tuple[ConditionStatus, str, str]
    if conflicts:
        ready_value = ("False", "SelectedTwice", "; ".join(
            f"{n} is selected by RolloutPolicies {', '.join(sorted(conflict_views[n].policies))}: it waits on "
            "stable until only one selects it" for n in conflicts))
    else:
        ready_value = ("True", phase, _summary(st, spec))
    was_halted = prev.condition("Halted")
    for type_, value in (("Ready", ready_value), ("Halted", halted_value)):
        st.conditions = set_condition(st.conditions, type_, *value, generation=generation, now=now)
    if halted and (was_halted is None or was_halted.status != "True"):
        d.events.append(PolicyEvent("Warning", "Halted", halted_value[2]))
    return d


def _halted(spec: RolloutPolicySpec, failures: Mapping[str, Failure], counted: Sequence[str], spent: bool,
            wave_failed: int | None) -> tuple[ConditionStatus, str, str]:
    listed = "; ".join(f"{n} (revision {failures[n].revision}: {failures[n].reason}"
                       f"{': ' + failures[n].message if failures[n].message else ''})" for n in counted)
    if spent:
        return ("True", "FailureBudgetSpent",
                f"{len(counted)} rollback(s) since the last resume, failureBudget {spec.failure_budget}: no new "
                f"canary starts until `folio fleet resume`; rolled back: {listed}")
    if wave_failed is not None:
        return ("True", "WaveRolledBack",
                f"wave {_wave_label(spec, wave_failed) or 'unlabelled'} ended with rollback(s): the next wave "
                f"waits for `folio fleet resume`; rolled back: {listed}")
    return ("False", "WithinBudget",
            f"{len(counted)} of {spec.failure_budget} rollback(s) allowed since the last resume")


def _summary(st: RolloutPolicyStatus, spec: RolloutPolicySpec) -> str:
    wave = st.wave or ("unlabelled" if spec.waves else "-")
    text = (f"{len(st.running)} running (max {spec.max_concurrent}), {len(st.pending)} pending, "
            f"{len(st.promoted)} promoted, {len(st.rolled_back)} rolled back; wave {wave}")
    if st.phase == "Soaking":
        text += f", soaking until {st.soak_until}"
    return text
