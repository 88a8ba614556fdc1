"""The parity gate's decisions, before step 1: no user request reaches a canary until its answers match stable's.

With ``spec.rollout.parity`` set, a ready canary waits at weight 0 (and gets no shadow copies) until
a report for it, against the current stable revision, is in ``status.canary.parity``. The caller runs
the gate when `due` says so (`folio.operator.parity.run.poll_gate`) and passes the report in
``Observed.parity``; the rollout state machine (`folio.operator.rollout.canary`) asks `decide` what
it means and acts on the answer: `Proceed` lets step 1 start; `Fail` rolls the canary back with reason
``ParityFailed`` (Degraded carries the figures, a Warning Event the worst prompts, and the report stays
in ``failedRevisions``); `Wait` keeps it at weight 0, either for a report still pending or because the
gate could not run (a suite that cannot be used, an unreachable replica: Degraded=True says why, see
`degraded`, and the gate is tried again every `RETRY_S`). The ``promote`` override skips the gate.

Everything here is pure, over spec, status and the report just observed; nothing imports the rollout.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from folio.operator.parity.compare import describe_diff, describe_figures
from folio.operator.spec import (
    CanaryStatus,
    InferenceServiceSpec,
    InferenceServiceStatus,
    ParityReport,
    ParitySpec,
    RevisionStatus,
    as_utc,
    now_iso,
    parse_time,
)

RETRY_S = 30.0  # a gate that could not run is tried again this long after
POLL_S = 2.0  # while a gate runs, a pass this often picks its report up


def due(spec: InferenceServiceSpec, status: InferenceServiceStatus, now: datetime) -> tuple[str, str] | None:
    """(canary, stable) when their gate should run now: the gate is asked for, step 1 has not started,
    both have a ready replica, and no report for this pair exists (or the last could not run, long enough
    ago)."""
    c, canary, stable = status.canary, status.revision(status.canary_revision), status.revision(status.stable_revision)
    if spec.rollout.parity is None or c is None or canary is None or stable is None or c.step_started_at:
        return None
    if not (canary.weights_ready and canary.ready_replicas > 0 and stable.ready_replicas > 0):
        return None
    r = _current(c.parity, canary, stable.name)
    if r is not None:
        if r.verdict != "Error":
            return None
        if r.at is not None and (as_utc(now) - parse_time(r.at)).total_seconds() < RETRY_S:
            return None
    return canary.name, stable.name


EventText = tuple[Literal["Normal", "Warning"], str, str]  # (type, reason, message) of an Event to emit


@dataclass(frozen=True)
class Proceed:
    """The gate passed (or is not asked for, or skipped by ``promote``): step 1 may start."""


@dataclass(frozen=True)
class Wait:
    """The canary stays at weight 0: its report is pending (or could not be made); look again in ``requeue_s``."""

    requeue_s: float


@dataclass(frozen=True)
class Fail:
    """The canary failed the gate: roll it back with ``reason`` and ``message``, keep ``report`` in its
    ``failedRevisions`` entry, then emit ``events`` (the worst prompts)."""

    reason: str
    message: str
    report: ParityReport
    events: tuple[EventText, ...] = ()


Action = Proceed | Wait | Fail


@dataclass(frozen=True)
class GateDecision:
    """What the gate decides in one pass: ``record`` (when not None) is a newly observed report to keep in
    ``status.canary.parity``, announced by ``events`` (emitted before ``action`` is acted on)."""

    action: Action
    record: ParityReport | None = None
    events: tuple[EventText, ...] = ()


def decide(
    spec: InferenceServiceSpec,
    status: InferenceServiceStatus,
    canary: RevisionStatus,
    observed: ParityReport | None,
    now: datetime,
    *,
    promote: bool = False,
) -> GateDecision:
    """The gate's answer for ``canary``, ready and before step 1, given the report ``observed`` just now
    (`Observed.parity`, None when no gate finished). ``promote``: the override is asked for."""
    gate, c = spec.rollout.parity, status.canary
    if gate is None or promote or c is None:
        return GateDecision(Proceed())
    record, events = _record(gate, canary, c.parity, observed, now_iso(as_utc(now)))
    stable_name = status.stable_revision
    r = _current(record if record is not None else c.parity, canary, stable_name)
    if r is not None and r.verdict == "Pass":
        return GateDecision(Proceed(), record, events)
    if r is not None and r.verdict == "Fail":
        message = (f"canary {canary.name} failed the parity gate against {stable_name} before taking traffic: "
                   f"{describe_figures(r, gate)}")
        diff: EventText = ("Warning", "ParityDiff", f"canary {canary.name} vs {stable_name}: {describe_diff(r)}")
        return GateDecision(Fail("ParityFailed", message, r, (diff,)), record, events)
    return GateDecision(Wait(RETRY_S if r is not None else POLL_S), record, events)


def _record(
    gate: ParitySpec, canary: RevisionStatus, recorded: ParityReport | None, seen: ParityReport | None, at: str
) -> tuple[ParityReport | None, tuple[EventText, ...]]:
    """``seen`` (stamped ``at`` if it has no time) when it is about this canary and newer than the
    ``recorded`` one, with the Event that announces it; (None, ()) otherwise."""
    if seen is None or seen.revision != canary.name:
        return None, ()
    if seen.at is None:
        seen = seen.model_copy(update={"at": at})
    if recorded is not None and recorded.at is not None and parse_time(seen.at or at) <= parse_time(recorded.at):
        return None, ()  # already recorded
    if seen.verdict == "Pass":
        return seen, (("Normal", "ParityPassed",
                       f"canary {canary.name}: {describe_figures(seen, gate)} in {seen.seconds or 0:.0f}s"),)
    if seen.verdict == "Error" and (recorded is None or recorded.message != seen.message):
        return seen, (("Warning", "ParityGateError", f"canary {canary.name} waits without traffic: {seen.message}"),)
    return seen, ()


def _current(r: ParityReport | None, canary: RevisionStatus, stable: str | None) -> ParityReport | None:
    """``r`` if it is about this canary against this stable revision."""
    if r is None or r.revision != canary.name or r.stable_revision != stable:
        return None
    return r


def degraded(status: InferenceServiceStatus) -> tuple[str, str] | None:
    """(reason, message) for Degraded=True while the gate cannot run."""
    c = status.canary
    r = c.parity if c is not None else None
    if r is None or r.verdict != "Error" or r.revision != status.canary_revision or c is None or c.step_started_at:
        return None
    return "ParityGateError", f"canary {r.revision} waits without traffic: parity gate could not run: {r.message}"


def waiting(spec: InferenceServiceSpec, canary: RevisionStatus, c: CanaryStatus) -> tuple[str, str] | None:
    """Progressing's (reason, message) while a ready canary waits for its gate."""
    if spec.rollout.parity is None or c.step_started_at is not None or canary.ready_replicas == 0:
        return None
    return "ParityGate", f"comparing canary {canary.name} with stable on the parity suite before step 1"


def holds_shadow(status: InferenceServiceStatus) -> bool:
    """Whether shadow copies must not reach the canary yet, for a spec that asks for the gate (the caller
    checks ``spec.rollout.parity``): its gate has not passed, step 1 has not started."""
    return status.canary is not None and status.canary_revision is not None and status.canary.step_started_at is None
