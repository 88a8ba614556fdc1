"""The parity gate, before step 1: no user request reaches a canary until its answers match stable's.

With ``spec.rollout.parity`` set, a ready canary waits at weight 0 (and gets no shadow copies) until
a report for it, against the current stable revision, is in ``status.canary.parity``. The caller runs
the gate when `due` says so (`folio.operator.analysis.parity_run`) and passes the report in
``Observed.parity``. ``Pass`` lets step 1 start; ``Fail`` rolls the canary back with reason
``ParityFailed`` (Degraded carries the figures, a Warning Event the worst prompts, and the report stays
in ``failedRevisions``); ``Error`` (a suite that cannot run, an unreachable replica) keeps the canary
waiting with Degraded=True saying why, and the gate is tried again every `RETRY_S`. The ``promote``
override skips the gate.
"""

from __future__ import annotations

from datetime import datetime

from folio.operator.analysis.parity import describe_diff, describe_figures
from folio.operator.rollout.state import Pass
from folio.operator.rollout.transitions import fail
from folio.operator.spec import (
    CanaryStatus,
    InferenceServiceSpec,
    InferenceServiceStatus,
    ParityReport,
    RevisionStatus,
    as_utc,
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
    r = _current(c, canary, stable.name)
    if r is not None:
        if r.verdict != "Error":
            return None
        if r.at is not None and (as_utc(now) - parse_time(r.at)).total_seconds() < RETRY_S:
            return None
    return canary.name, stable.name


def holds(p: Pass, canary: RevisionStatus, c: CanaryStatus) -> bool:
    """True while the gate keeps the canary from step 1 (its report pending, failed or unable to run)."""
    gate = p.spec.rollout.parity
    if gate is None or "promote" in p.overrides:
        return False
    stable_name = p.st.stable_revision
    _record(p, canary, c)
    r = _current(c, canary, stable_name)
    if r is not None and r.verdict == "Pass":
        return False
    if r is not None and r.verdict == "Fail":
        fail(p, canary, "ParityFailed",
             f"canary {canary.name} failed the parity gate against {stable_name} before taking traffic: "
             f"{describe_figures(r, gate)}")
        p.st.failed_revisions[-1].parity = r
        p.event("Warning", "ParityDiff", f"canary {canary.name} vs {stable_name}: {describe_diff(r)}")
        return True
    p.requeue.append(RETRY_S if r is not None else POLL_S)
    return True


def _record(p: Pass, canary: RevisionStatus, c: CanaryStatus) -> None:
    seen = p.observed.parity
    if seen is None or seen.revision != canary.name:
        return
    if seen.at is None:
        seen = seen.model_copy(update={"at": p.at})
    if c.parity is not None and c.parity.at is not None and parse_time(seen.at or p.at) <= parse_time(c.parity.at):
        return  # already recorded
    previous, c.parity = c.parity, seen
    gate = p.spec.rollout.parity
    assert gate is not None
    if seen.verdict == "Pass":
        p.event("Normal", "ParityPassed", f"canary {canary.name}: {describe_figures(seen, gate)} "
                f"in {seen.seconds or 0:.0f}s")
    elif seen.verdict == "Error" and (previous is None or previous.message != seen.message):
        p.event("Warning", "ParityGateError", f"canary {canary.name} waits without traffic: {seen.message}")


def _current(c: CanaryStatus, canary: RevisionStatus, stable: str | None) -> ParityReport | None:
    """The recorded report if it is about this canary against this stable revision."""
    r = c.parity
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


def holds_shadow(spec: InferenceServiceSpec | None, status: InferenceServiceStatus) -> bool:
    """Whether shadow copies must not reach the canary yet: its gate has not passed."""
    if spec is None or spec.rollout.parity is None or status.canary is None or status.canary_revision is None:
        return False
    return status.canary.step_started_at is None
