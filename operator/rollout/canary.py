"""The canary's steps: when one starts, when it ends, what a sample counts for, promotion.

A canary walks ``spec.rollout.steps`` once it is ready (verified weights, a ready replica, no
crash loop). A step ends when its pause is over *and* the latest analysis sample taken during the
step passed: an inconclusive sample is not a pass. A step Inconclusive for longer than
``maxInconclusiveDuration`` pauses, rolls back or ends as ``onInconclusive`` says (`inconclusive`). ``failureLimit`` consecutive failing samples
roll it back (a pass resets the count, an inconclusive one does not). After the last step, or on
the ``promote`` override, it is promoted: it becomes Stable and the old stable retires.
"""

from __future__ import annotations

from folio.operator.autoscaling.share import promotion_ready
from folio.operator.parity import gate as parity_gate
from folio.operator.rollout import inconclusive
from folio.operator.rollout.conditions import describe_sample
from folio.operator.rollout.state import Pass
from folio.operator.rollout.transitions import fail, retire
from folio.operator.spec import CanaryStatus, RevisionStatus, parse_time


def progress(p: Pass) -> None:
    canary, c = p.canary(), p.st.canary
    if canary is None or c is None:
        if "promote" in p.overrides:
            p.done.add("promote")
            p.event("Warning", "NothingToPromote", "no canary in progress; promote ignored")
        return
    if not p.ready_now(canary):
        return  # waits for weights and replicas; "promote" stays pending until it can act
    steps = p.spec.rollout.steps
    if not steps:  # no steps (or all removed from the spec mid-rollout): straight to stable
        promote(p, canary, "the rollout has no steps")
        return
    if c.step_started_at is None:
        if gate_holds(p, canary, c):  # no traffic before the canary answers as stable does
            return
        start_step(p, 0)
    c.step = min(c.step, len(steps) - 1)  # the spec may have lost steps since
    if count_sample(p, c):
        return
    if "promote" in p.overrides:
        p.done.add("promote")
        promote(p, canary, "promoted as asked")
        return
    assert c.step_started_at is not None
    left = parse_time(c.step_started_at).timestamp() + steps[c.step].pause_seconds - p.now.timestamp()
    if inconclusive.act(p, c):
        fail(p, canary, inconclusive.TOO_LONG,
             f"canary {canary.name} rolled back (onInconclusive Rollback): {inconclusive.message(p, c)}")
        return
    if c.paused is not None:
        p.requeue.append(p.spec.rollout.analysis.interval_seconds)  # samples go on: failing ones still count
        return
    if left <= 0 and (passed_this_step(c) or inconclusive.ended_without_evidence(c)):
        if c.step + 1 < len(steps):
            start_step(p, c.step + 1)
            left = steps[c.step].pause_seconds
        elif not promotion_ready(p.spec, p.st, p.facts(canary).ready_replicas):
            pass  # autoscaled: all traffic moves once the canary has the replicas the load needs
        else:
            promote(p, canary, _all_steps(c, len(steps)))
            return
    if left > 0:
        p.requeue.append(left)  # the step's pause ends then
    p.requeue.append(p.spec.rollout.analysis.interval_seconds)


def gate_holds(p: Pass, canary: RevisionStatus, c: CanaryStatus) -> bool:
    """True while the parity gate keeps the canary from step 1 (its report pending, failed or unable to
    run): records the report just observed, then acts on the gate's decision (`folio.operator.parity.gate`)."""
    d = parity_gate.decide(p.spec, p.st, canary, p.observed.parity, p.now, promote="promote" in p.overrides)
    if d.record is not None:
        c.parity = d.record
    for event in d.events:
        p.event(*event)
    action = d.action
    if isinstance(action, parity_gate.Proceed):
        return False
    if isinstance(action, parity_gate.Fail):
        fail(p, canary, action.reason, action.message)
        p.st.failed_revisions[-1].parity = action.report
        for event in action.events:
            p.event(*event)
        return True
    p.requeue.append(action.requeue_s)
    return True


def passed_this_step(c: CanaryStatus) -> bool:
    """The latest sample passed, and was taken during the current step: the one that ended the previous
    step (stamped when this one started) does not count, the canary has not been measured at this weight."""
    last = c.last_analysis
    return (
        last is not None
        and last.verdict == "Pass"
        and last.at is not None
        and c.step_started_at is not None
        and parse_time(last.at) > parse_time(c.step_started_at)
    )


def start_step(p: Pass, index: int) -> None:
    c, step = p.st.canary, p.spec.rollout.steps[index]
    assert c is not None
    c.step, c.step_started_at = index, p.at  # its weight is traffic.route's to write, from the step
    p.event(
        "Normal",
        "CanaryStep",
        f"canary {p.st.canary_revision}: step {index + 1}/{len(p.spec.rollout.steps)}, "
        f"{step.weight}% of traffic for at least {step.pause}",
    )


def count_sample(p: Pass, c: CanaryStatus) -> bool:
    """Record a new analysis sample; True when it ends the rollout in a rollback."""
    sample = p.observed.analysis
    if sample is None:
        return False
    if sample.at is None:
        sample = sample.model_copy(update={"at": p.at})
    assert sample.at is not None and c.step_started_at is not None
    last = c.last_analysis
    if last is not None and last.at is not None and parse_time(sample.at) <= parse_time(last.at):
        return False  # already counted (or older than what was)
    if c.step == 0 and parse_time(sample.at) <= parse_time(c.step_started_at):
        return False  # measured before the canary had any traffic
    c.last_analysis = inconclusive.stamp(sample, c, p.spec.rollout.analysis)
    if sample.verdict == "Fail":
        c.consecutive_failures += 1
    elif sample.verdict == "Pass":
        c.consecutive_failures = 0
    limit = p.spec.rollout.analysis.failure_limit
    if sample.verdict == "Fail":
        p.event(
            "Warning",
            "AnalysisFailed",
            f"canary {p.st.canary_revision} failed analysis "
            f"({c.consecutive_failures}/{limit}): {describe_sample(sample, p.spec)}",
        )
    if c.consecutive_failures < limit:
        return False
    canary = p.canary()
    assert canary is not None
    fail(
        p,
        canary,
        "AnalysisFailed",
        f"canary {canary.name} rolled back after {c.consecutive_failures} consecutive failed "
        f"analyses (failureLimit {limit}): {describe_sample(sample, p.spec)}",
    )
    return True


def _all_steps(c: CanaryStatus, n: int) -> str:
    unproven = c.steps_without_evidence or []
    if not unproven:
        return f"all {n} steps passed analysis"
    which = ", ".join(str(i + 1) for i in unproven)
    return (f"all {n} steps ended, step(s) {which} for lack of evidence: no conclusive analysis within "
            "maxInconclusiveDuration (onInconclusive Promote)")


def promote(p: Pass, canary: RevisionStatus, why: str) -> None:
    old = p.stable()
    canary.role = "Stable"
    p.st.stable_revision = canary.name
    p.st.canary_revision, p.st.canary = None, None
    if old is not None:
        retire(p, old)
    p.promoted = True
    p.event("Normal", "Promoted", f"revision {canary.name} promoted to stable: {why}")
