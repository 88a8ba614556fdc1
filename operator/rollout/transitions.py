"""How revisions enter, change role in, and leave status (everything but the canary's steps).

- The spec's revision is admitted as the Stable revision while nothing has served yet (replacing
  one that never did), else as the Canary; a newer one supersedes a running canary, whose traffic
  returns to stable first and which then drains like a retiring revision.
- Weights that fail verification, a crash loop (for a revision that has not served) or the
  ``abort`` override fail a revision: it is listed in ``failedRevisions`` with the figures and not
  started again until the spec names another revision or ``retry`` is asked.
- A replaced stable revision is Retiring for ``drainPeriod`` (at weight 0), then dropped.
- A revision that would become the canary waits while ``observed.waiting`` says a RolloutPolicy holds it
  (Progressing=True, reason WaitingForRolloutPolicy); a canary already running is not affected.
"""

from __future__ import annotations

from datetime import timedelta

from folio.operator.rollout import inconclusive
from folio.operator.rollout.conditions import describe_sample
from folio.operator.rollout.state import Pass
from folio.operator.spec import (
    CanaryStatus,
    FailedRevision,
    RevisionStatus,
    now_iso,
    parse_duration,
    parse_time,
)

# failedRevisions keeps this many most recent entries; older ones are forgotten.
FAILED_HISTORY = 10


def refresh_facts(p: Pass) -> None:
    """Status keeps the last facts seen of each revision, for the next pass and for restarts."""
    for rev in p.st.revisions:
        seen = p.observed.revisions.get(rev.name)
        if seen is not None:
            rev.weights_ready = seen.weights == "ready"
            rev.ready_replicas = seen.ready_replicas


def drop_drained(p: Pass) -> None:
    for rev in list(p.st.revisions):
        if rev.role != "Retiring":
            continue
        left = (parse_time(rev.retire_at) - p.now).total_seconds() if rev.retire_at else 0.0
        if left <= 0:
            p.drop(rev.name)
            p.event("Normal", "Retired", f"revision {rev.name} drained and removed")
        else:
            p.requeue.append(left)


def retry(p: Pass) -> None:
    if "retry" not in p.overrides:
        return
    p.done.add("retry")
    if p.failed(p.target) is None:
        if p.st.canary_revision == p.target and inconclusive.resume(p):
            return  # a paused canary analyses its step afresh
        p.event("Warning", "NothingToRetry", f"revision {p.target} has not failed; retry ignored")
        return
    p.st.failed_revisions = [f for f in p.st.failed_revisions if f.revision != p.target]
    p.drop(p.target)  # re-admitted fresh below
    p.event("Normal", "Retry", f"retrying revision {p.target} as asked")


def admit_target(p: Pass) -> None:
    """Make the spec's revision the stable (nothing serves yet) or the canary."""
    # A failed revision stays listed (scaled to zero) only while the spec still names it.
    for rev in list(p.st.revisions):
        if rev.role == "Failed" and rev.name != p.target:
            p.drop(rev.name)
    if p.target in (p.st.stable_revision, p.st.canary_revision) or p.failed(p.target):
        if p.st.canary_revision not in (None, p.target):
            supersede_canary(p)
        return
    if not p.stable_serves() and p.st.stable_revision not in p.served:
        _replace_idle_stable(p)
        return
    if p.observed.waiting is not None:  # a RolloutPolicy has not admitted it: stable (and any canary) go on
        p.waiting = p.observed.waiting
        return
    supersede_canary(p)
    p.take_target("Canary")
    p.st.canary_revision = p.target
    p.st.canary = CanaryStatus(started_at=p.at)
    p.event("Normal", "CanaryCreated", f"revision {p.target} will be rolled out as a canary")


def _replace_idle_stable(p: Pass) -> None:
    """No revision has served yet: the spec's revision simply takes the stable's place."""
    old = p.st.stable_revision
    if old is not None:
        p.drop(old)
        p.event("Normal", "Superseded", f"revision {old} never served; replaced by {p.target}")
    supersede_canary(p)
    p.take_target("Stable")
    p.st.stable_revision = p.target
    p.event("Normal", "RevisionCreated", f"revision {p.target} will be the stable revision")


def supersede_canary(p: Pass) -> None:
    canary = p.canary()
    if canary is None:
        p.st.canary_revision, p.st.canary = None, None
        return
    had_traffic = canary.name in p.served
    p.st.canary_revision, p.st.canary = None, None
    if had_traffic:  # traffic returns to stable now; the pods drain before they go
        retire(p, canary)
    else:
        p.drop(canary.name)
    p.event("Normal", "Superseded", f"canary {canary.name} superseded by revision {p.target}")


def retire(p: Pass, rev: RevisionStatus) -> None:
    drain = parse_duration(p.spec.rollout.drain_period)
    if drain <= 0:
        p.drop(rev.name)
        return
    rev.role = "Retiring"
    rev.retire_at = now_iso(p.now + timedelta(seconds=drain))
    p.requeue.append(drain)


def fail_broken(p: Pass) -> None:
    """Weights that failed verification, or pods in a crash loop, fail the revision on the way in."""
    candidates = [p.canary()]
    stable = p.stable()
    if stable is not None and stable.name not in p.served:
        candidates.append(stable)
    for rev in candidates:
        if rev is None:
            continue
        facts = p.facts(rev)
        if facts.weights == "failed":
            detail = facts.weights_message or "the pre-pull did not produce the pinned weights"
            fail(p, rev, "WeightsFailed", f"weights of revision {rev.name} failed: {detail}")
        elif facts.crash_looping:
            fail(p, rev, "CrashLoopBackOff", f"revision {rev.name} is crash-looping; {figures(p)}")


def abort(p: Pass) -> None:
    if "abort" not in p.overrides:
        return
    p.done.add("abort")
    canary = p.canary()
    if canary is None:
        p.event("Warning", "NothingToAbort", "no canary in progress; abort ignored")
        return
    fail(p, canary, "Aborted", f"rollout of {canary.name} aborted as asked; {figures(p)}")


def fail(p: Pass, rev: RevisionStatus, reason: str, message: str) -> None:
    rev.role, rev.retire_at, rev.ready_replicas = "Failed", None, 0  # the plan runs nothing for it
    evidence = None
    if rev.name == p.st.canary_revision:
        last = p.st.canary.last_analysis if p.st.canary else None
        evidence = last.model_copy(update={"accumulated": None}) if last else None  # the figures, not the counters
        p.st.canary_revision, p.st.canary = None, None
        if rev.name in p.served:
            message = f"{message}; traffic is back on stable revision {p.st.stable_revision}"
    if rev.name == p.st.stable_revision:
        p.st.stable_revision = None
    failed = FailedRevision(revision=rev.name, reason=reason, at=p.at, message=message, last_analysis=evidence)
    p.st.failed_revisions = [*p.st.failed_revisions, failed][-FAILED_HISTORY:]
    rolled_back = reason in ("AnalysisFailed", "CrashLoopBackOff", inconclusive.TOO_LONG)
    p.event("Warning", "RolledBack" if rolled_back else reason, message)


def figures(p: Pass) -> str:
    """The canary's latest analysis, for failure messages."""
    sample = p.st.canary.last_analysis if p.st.canary else None
    return describe_sample(sample, p.spec) if sample else "no analysis sample yet"
