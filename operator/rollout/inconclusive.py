"""A step whose analysis stays Inconclusive: for how long, and what ``analysis.onInconclusive`` does then.

While the step's latest sample is Inconclusive its analysis window grows (`folio.operator.analysis.growth`);
the window's start is therefore since when the step has had no conclusive sample. Once that has lasted
``maxInconclusiveDuration``:

- ``Pause`` holds the canary at its step and weight (``status.canary.paused``; Progressing=False, reason
  `TOO_LONG`) until someone acts: ``promote`` promotes it, ``abort`` rolls it back, ``retry`` analyses the
  step afresh (`resume`). Samples are still taken meanwhile: failing ones still roll it back, passing ones
  do not end the pause.
- ``Rollback`` rolls it back like a failed analysis (reason `TOO_LONG`).
- ``Promote`` ends the step as if its analysis had passed (once its pause is over too), with a Warning
  Event; the step is listed in ``status.canary.stepsWithoutEvidence`` and the promotion says so.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from folio.operator.rollout.state import Pass
from folio.operator.spec import AnalysisSample, AnalysisSpec, CanaryPause, CanaryStatus, now_iso, parse_time

TOO_LONG = "InconclusiveTooLong"  # reason of the Events, the Progressing condition and a rollback


def inconclusive_since(c: CanaryStatus) -> datetime | None:
    """Since when the current step has had no conclusive sample; None while its latest sample (if any) was
    conclusive, or none was taken during the step yet."""
    last = c.last_analysis
    if last is None or last.verdict != "Inconclusive" or last.at is None or c.step_started_at is None:
        return None
    step_start = parse_time(c.step_started_at)
    if parse_time(last.at) <= step_start:
        return None  # taken before this step began
    return max(parse_time(last.since or last.at), step_start)


def stamp(sample: AnalysisSample, c: CanaryStatus, spec: AnalysisSpec) -> AnalysisSample:
    """An Inconclusive sample about to be counted, with the start of the time the step has gone without a
    verdict as its ``since``: its window's start, or the previous sample's when that was Inconclusive too
    (the sampler's growing window says the same; this keeps the clock right for any source)."""
    if sample.verdict != "Inconclusive" or sample.at is None:
        return sample
    at = parse_time(sample.at)
    own = parse_time(sample.since) if sample.since else at - timedelta(seconds=spec.interval_seconds)
    if c.step_started_at is not None:
        own = max(own, parse_time(c.step_started_at))
    before = inconclusive_since(c)
    since = min(own, before) if before is not None else own
    return sample.model_copy(update={"since": now_iso(min(since, at))})


def seconds_left(spec: AnalysisSpec, c: CanaryStatus, now: datetime) -> float | None:
    """Seconds until ``maxInconclusiveDuration`` runs out for this step (0 or less: it has); None when the
    step is not Inconclusive."""
    since = inconclusive_since(c)
    if since is None:
        return None
    return (since + timedelta(seconds=spec.max_inconclusive_seconds) - now).total_seconds()


def ended_without_evidence(c: CanaryStatus) -> bool:
    """The current step may end as if it passed (``onInconclusive: Promote`` acted on it)."""
    return c.step in (c.steps_without_evidence or ())


def act(p: Pass, c: CanaryStatus) -> bool:
    """What ``onInconclusive`` does once the step has been Inconclusive too long: Pause and Promote mark the
    step here; True for Rollback, which the caller does (with `message`). Before it is due, the time it
    will be goes to ``p.requeue``."""
    spec = p.spec.rollout.analysis
    if c.paused is not None or ended_without_evidence(c):
        return False  # acted on already
    left = seconds_left(spec, c, p.now)
    if left is None:
        return False
    if left > 0:
        p.requeue.append(left)
        return False
    where = f"canary {p.st.canary_revision} at step {c.step + 1}/{len(p.spec.rollout.steps)}"
    if spec.on_inconclusive == "Rollback":
        return True
    if spec.on_inconclusive == "Pause":
        text = (f"{where} paused with {c.weight}% of traffic: {message(p, c)}; it stays there until "
                "`folio promote`, `folio abort` or `folio retry` (analyses the step afresh)")
        c.paused = CanaryPause(at=p.at, reason=TOO_LONG, message=text)
        p.event("Warning", TOO_LONG, text)
        return False
    c.steps_without_evidence = sorted({*(c.steps_without_evidence or ()), c.step})
    p.event("Warning", TOO_LONG, f"{where} ends without conclusive analysis (onInconclusive Promote): "
                                 f"{message(p, c)}")
    return False


def message(p: Pass, c: CanaryStatus) -> str:
    """How long the step has gone without a verdict, and what ``minRequests`` asks for."""
    spec = p.spec.rollout.analysis
    since = inconclusive_since(c)
    last = c.last_analysis
    if since is None or last is None:
        return f"no conclusive analysis within maxInconclusiveDuration {spec.max_inconclusive_duration}"
    seconds = (p.now - since).total_seconds()
    return (f"no conclusive analysis for {seconds:.0f} s (maxInconclusiveDuration {spec.max_inconclusive_duration}): "
            f"{last.requests} canary requests since {now_iso(since)}, where minRequests {spec.min_requests} "
            "are needed; more traffic at this weight or a lower minRequests would decide it")


def paused(c: CanaryStatus | None) -> bool:
    return c is not None and c.paused is not None


def resume(p: Pass) -> bool:
    """The ``retry`` override on a paused canary: its step starts over (pause, analysis window and
    Inconclusive clock afresh) at the same weight. False when the canary is not paused."""
    c = p.st.canary
    if c is None or c.paused is None:
        return False
    c.paused, c.step_started_at = None, p.at
    c.steps_without_evidence = [s for s in c.steps_without_evidence or () if s != c.step] or None
    p.event("Normal", "Resumed", f"canary {p.st.canary_revision}: step {c.step + 1}/{len(p.spec.rollout.steps)} "
                                 "analysed afresh as asked")
    return True
