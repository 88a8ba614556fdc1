"""The rollout state machine: pure, deterministic, and driven by status alone.

``advance(spec, generation, status, observed)`` looks at what the spec asks for, what status says
has happened so far and what was just observed (weights, ready replicas, an analysis sample, manual
overrides, the time) and returns the next status plus the Events to emit. It does no I/O, so the
operator's kopf handlers and the local runtime (`folio up`) share it, and a restarted controller
continues exactly where the last one stopped: everything it needs is in ``status``.

The model, in short (docs/rollouts.md has the long version with a worked example):

- The first revision goes straight to Stable once its weights are verified and a replica is ready.
- A later revision becomes the Canary. It gets no traffic until its weights are verified and it
  has ready replicas; then it walks ``spec.rollout.steps``. A step ends when its pause is over
  *and* the latest analysis during the step passed (an inconclusive sample is not a pass).
  After the last step it is promoted: it becomes Stable with 100% and the old stable is Retiring
  (weight 0) for ``drainPeriod`` before it is dropped.
- ``failureLimit`` consecutive failing samples, a crash-looping canary, weights that fail
  verification or the ``abort`` override fail the revision: traffic returns to 100% stable, the
  revision is listed in ``failedRevisions`` with the figures, and ``Degraded=True`` says why. It is
  not tried again until the spec names a different revision or the ``retry`` override is given.
- A newer revision mid-canary supersedes the canary: its traffic goes back to stable first and it
  drains like a retiring revision.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from folio.operator.spec import (
    AnalysisSample,
    CanaryStatus,
    ConditionStatus,
    FailedRevision,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RevisionStatus,
    TrafficTarget,
    now_iso,
    parse_duration,
    revision_name,
)
from folio.operator.status import as_utc, parse_time, set_condition

OVERRIDES = frozenset({"promote", "abort", "retry"})
# failedRevisions keeps this many most recent entries; older ones are forgotten.
FAILED_HISTORY = 10
# Never ask to be called back sooner than this: status timestamps have one-second resolution.
MIN_REQUEUE_S = 1.0


@dataclass(frozen=True)
class RevisionFacts:
    """What the caller saw of one revision just now."""

    weights: Literal["pending", "ready", "failed"]
    weights_message: str = ""
    ready_replicas: int = 0
    crash_looping: bool = False


@dataclass(frozen=True)
class Observed:
    """Everything ``advance`` may look at besides spec and status.

    ``revisions`` may omit a revision; its last known state in status is used then. ``analysis`` is
    the latest sample for the canary; one with an ``at`` already recorded in status is not counted
    twice, so callers may pass the same sample on every call. ``overrides`` holds the names of the
    ``folio.dev/<name>`` annotations present (``promote``, ``abort``, ``retry``).
    """

    now: datetime
    revisions: dict[str, RevisionFacts] = field(default_factory=dict)
    analysis: AnalysisSample | None = None
    overrides: frozenset[str] = frozenset()


@dataclass
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Decision:
    status: InferenceServiceStatus
    events: list[Event]
    overrides_done: frozenset[str]  # annotations acted on: the caller removes them
    requeue_after: float | None  # seconds until the next time-based transition or analysis


def advance(
    spec: InferenceServiceSpec,
    generation: int | None,
    status: InferenceServiceStatus,
    observed: Observed,
) -> Decision:
    """Compute the next status from spec, the current status and what was observed."""
    return _Advance(spec, generation, status, observed).run()


class _Advance:
    """One call of ``advance``: a working copy of status plus what this call decided."""

    def __init__(
        self,
        spec: InferenceServiceSpec,
        generation: int | None,
        status: InferenceServiceStatus,
        observed: Observed,
    ) -> None:
        self.spec = spec
        self.generation = generation
        self.st = status.model_copy(deep=True)
        self.observed = observed
        self.now = as_utc(observed.now)
        self.at = now_iso(self.now)
        self.target = revision_name(spec)
        self.overrides = set(observed.overrides & OVERRIDES)
        self.done: set[str] = set()
        self.events: list[Event] = []
        self.requeue: list[float] = []
        # "Has served" is read from the traffic status had on entry, so it survives restarts.
        self.served = {t.revision for t in status.traffic if t.weight > 0}
        self.previous_phase = status.phase
        self.promoted = False

    # ------------------------------------------------------------------ driver

    def run(self) -> Decision:
        self._drop_drained()
        self._retry()
        self._admit_target()
        self._refresh_facts()
        self._fail_broken()
        self._abort()
        self._progress_canary()
        self._route()
        self._summarize()
        self.st.observed_generation = self.generation
        requeue = max(min(self.requeue), MIN_REQUEUE_S) if self.requeue else None
        return Decision(self.st, self.events, frozenset(self.done), requeue)

    # ----------------------------------------------------------------- helpers

    def _event(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def _facts(self, rev: RevisionStatus) -> RevisionFacts:
        seen = self.observed.revisions.get(rev.name)
        if seen is not None:
            return seen
        return RevisionFacts("ready" if rev.weights_ready else "pending", ready_replicas=rev.ready_replicas)

    def _ready_now(self, rev: RevisionStatus) -> bool:
        facts = self._facts(rev)
        return facts.weights == "ready" and facts.ready_replicas > 0 and not facts.crash_looping

    def _failed(self, name: str) -> FailedRevision | None:
        return next((f for f in reversed(self.st.failed_revisions) if f.revision == name), None)

    def _stable(self) -> RevisionStatus | None:
        return self.st.revision(self.st.stable_revision)

    def _canary(self) -> RevisionStatus | None:
        return self.st.revision(self.st.canary_revision)

    def _take_target(self, role: Literal["Stable", "Canary"]) -> None:
        """List the spec's revision with ``role``; a retiring one brought back must earn traffic again."""
        rev = self.st.revision(self.target)
        if rev is not None:
            rev.role, rev.retire_at = role, None
            return
        self.st.revisions.append(
            RevisionStatus(
                name=self.target,
                role=role,
                model=self.spec.model.model_copy(deep=True),
                image=self.spec.engine.image,
                args=dict(self.spec.engine.args),
                created_at=self.at,
            )
        )

    def _drop(self, name: str) -> None:
        self.st.revisions = [r for r in self.st.revisions if r.name != name]

    def _stable_serves(self) -> bool:
        """The stable revision may carry traffic: verified weights, and ready now or already serving."""
        stable = self._stable()
        if stable is None or stable.role != "Stable":
            return False
        facts = self._facts(stable)
        return facts.weights == "ready" and (facts.ready_replicas > 0 or stable.name in self.served)

    # ------------------------------------------------------------------- steps

    def _refresh_facts(self) -> None:
        for rev in self.st.revisions:
            seen = self.observed.revisions.get(rev.name)
            if seen is not None:
                rev.weights_ready = seen.weights == "ready"
                rev.ready_replicas = seen.ready_replicas

    def _drop_drained(self) -> None:
        for rev in list(self.st.revisions):
            if rev.role != "Retiring":
                continue
            left = (parse_time(rev.retire_at) - self.now).total_seconds() if rev.retire_at else 0.0
            if left <= 0:
                self._drop(rev.name)
                self._event("Normal", "Retired", f"revision {rev.name} drained and removed")
            else:
                self.requeue.append(left)

    def _retry(self) -> None:
        if "retry" not in self.overrides:
            return
        self.done.add("retry")
        if self._failed(self.target) is None:
            self._event("Warning", "NothingToRetry", f"revision {self.target} has not failed; retry ignored")
            return
        self.st.failed_revisions = [f for f in self.st.failed_revisions if f.revision != self.target]
        self._drop(self.target)  # re-admitted fresh below
        self._event("Normal", "Retry", f"retrying revision {self.target} as asked")

    def _admit_target(self) -> None:
        """Make the spec's revision the stable (nothing serves yet) or the canary."""
        # A failed revision stays listed (scaled to zero) only while the spec still names it.
        for rev in list(self.st.revisions):
            if rev.role == "Failed" and rev.name != self.target:
                self._drop(rev.name)
        if self.target in (self.st.stable_revision, self.st.canary_revision) or self._failed(self.target):
            if self.st.canary_revision not in (None, self.target):
                self._supersede_canary()
            return
        if not self._stable_serves() and self.st.stable_revision not in self.served:
            self._replace_idle_stable()
            return
        self._supersede_canary()
        self._take_target("Canary")
        self.st.canary_revision = self.target
        self.st.canary = CanaryStatus(started_at=self.at)
        self._event("Normal", "CanaryCreated", f"revision {self.target} will be rolled out as a canary")

    def _replace_idle_stable(self) -> None:
        """No revision has served yet: the spec's revision simply takes the stable's place."""
        old = self.st.stable_revision
        if old is not None:
            self._drop(old)
            self._event("Normal", "Superseded", f"revision {old} never served; replaced by {self.target}")
        self._supersede_canary()
        self._take_target("Stable")
        self.st.stable_revision = self.target
        self._event("Normal", "RevisionCreated", f"revision {self.target} will be the stable revision")

    def _supersede_canary(self) -> None:
        canary = self._canary()
        if canary is None:
            self.st.canary_revision, self.st.canary = None, None
            return
        had_traffic = canary.name in self.served
        self.st.canary_revision, self.st.canary = None, None
        if had_traffic:  # traffic returns to stable now; the pods drain before they go
            self._retire(canary)
        else:
            self._drop(canary.name)
        self._event("Normal", "Superseded", f"canary {canary.name} superseded by revision {self.target}")

    def _retire(self, rev: RevisionStatus) -> None:
        drain = parse_duration(self.spec.rollout.drain_period)
        if drain <= 0:
            self._drop(rev.name)
            return
        rev.role = "Retiring"
        rev.retire_at = now_iso(self.now + timedelta(seconds=drain))
        self.requeue.append(drain)

    def _fail_broken(self) -> None:
        """Weights that failed verification, or pods in a crash loop, fail the revision on the way in."""
        candidates = [self._canary()]
        stable = self._stable()
        if stable is not None and stable.name not in self.served:
            candidates.append(stable)
        for rev in candidates:
            if rev is None:
                continue
            facts = self._facts(rev)
            if facts.weights == "failed":
                detail = facts.weights_message or "the pre-pull did not produce the pinned weights"
                self._fail(rev, "WeightsFailed", f"weights of revision {rev.name} failed: {detail}")
            elif facts.crash_looping:
                self._fail(rev, "CrashLoopBackOff", f"revision {rev.name} is crash-looping; {self._figures()}")

    def _abort(self) -> None:
        if "abort" not in self.overrides:
            return
        self.done.add("abort")
        canary = self._canary()
        if canary is None:
            self._event("Warning", "NothingToAbort", "no canary in progress; abort ignored")
            return
        self._fail(canary, "Aborted", f"rollout of {canary.name} aborted as asked; {self._figures()}")

    def _fail(self, rev: RevisionStatus, reason: str, message: str) -> None:
        rev.role, rev.retire_at, rev.ready_replicas = "Failed", None, 0  # the planner scales it to zero
        evidence = None
        if rev.name == self.st.canary_revision:
            evidence = self.st.canary.last_analysis if self.st.canary else None
            self.st.canary_revision, self.st.canary = None, None
            if rev.name in self.served:
                message = f"{message}; traffic is back on stable revision {self.st.stable_revision}"
        if rev.name == self.st.stable_revision:
            self.st.stable_revision = None
        failed = FailedRevision(
            revision=rev.name, reason=reason, at=self.at, message=message, last_analysis=evidence
        )
        self.st.failed_revisions = [*self.st.failed_revisions, failed][-FAILED_HISTORY:]
        self._event("Warning", "RolledBack" if reason in ("AnalysisFailed", "CrashLoopBackOff") else reason, message)

    def _figures(self) -> str:
        """The canary's latest analysis, for failure messages."""
        sample = self.st.canary.last_analysis if self.st.canary else None
        return describe_sample(sample, self.spec) if sample else "no analysis sample yet"

    # ------------------------------------------------------------ the canary

    def _progress_canary(self) -> None:
        canary, c = self._canary(), self.st.canary
        if canary is None or c is None:
            if "promote" in self.overrides:
                self.done.add("promote")
                self._event("Warning", "NothingToPromote", "no canary in progress; promote ignored")
            return
        if not self._ready_now(canary):
            return  # waits for weights and replicas; "promote" stays pending until it can act
        steps = self.spec.rollout.steps
        if not steps:  # no steps (or all removed from the spec mid-rollout): straight to stable
            self._promote(canary, "the rollout has no steps")
            return
        if c.step_started_at is None:
            self._start_step(0)
        c.step = min(c.step, len(steps) - 1)  # the spec may have lost steps since
        if self._count_sample(c):
            return
        if "promote" in self.overrides:
            self.done.add("promote")
            self._promote(canary, "promoted as asked")
            return
        assert c.step_started_at is not None
        left = parse_time(c.step_started_at).timestamp() + steps[c.step].pause_seconds - self.now.timestamp()
        passed = (
            c.last_analysis is not None
            and c.last_analysis.verdict == "Pass"
            and c.last_analysis.at is not None
            and parse_time(c.last_analysis.at) >= parse_time(c.step_started_at)
        )
        if left <= 0 and passed:
            if c.step + 1 < len(steps):
                self._start_step(c.step + 1)
                left = steps[c.step].pause_seconds
            else:
                self._promote(canary, f"all {len(steps)} steps passed analysis")
                return
        if left > 0:
            self.requeue.append(left)
        self.requeue.append(self.spec.rollout.analysis.interval_seconds)

    def _start_step(self, index: int) -> None:
        c, step = self.st.canary, self.spec.rollout.steps[index]
        assert c is not None
        c.step, c.weight, c.step_started_at = index, step.weight, self.at
        self._event(
            "Normal",
            "CanaryStep",
            f"canary {self.st.canary_revision}: step {index + 1}/{len(self.spec.rollout.steps)}, "
            f"{step.weight}% of traffic for at least {step.pause}",
        )

    def _count_sample(self, c: CanaryStatus) -> bool:
        """Record a new analysis sample; True when it ends the rollout in a rollback."""
        sample = self.observed.analysis
        if sample is None:
            return False
        if sample.at is None:
            sample = sample.model_copy(update={"at": self.at})
        assert sample.at is not None and c.step_started_at is not None
        last = c.last_analysis
        if last is not None and last.at is not None and parse_time(sample.at) <= parse_time(last.at):
            return False  # already counted (or older than what was)
        if c.step == 0 and parse_time(sample.at) <= parse_time(c.step_started_at):
            return False  # measured before the canary had any traffic
        c.last_analysis = sample
        if sample.verdict == "Fail":
            c.consecutive_failures += 1
        elif sample.verdict == "Pass":
            c.consecutive_failures = 0
        limit = self.spec.rollout.analysis.failure_limit
        if sample.verdict == "Fail":
            self._event(
                "Warning",
                "AnalysisFailed",
                f"canary {self.st.canary_revision} failed analysis "
                f"({c.consecutive_failures}/{limit}): {describe_sample(sample, self.spec)}",
            )
        if c.consecutive_failures < limit:
            return False
        canary = self._canary()
        assert canary is not None
        self._fail(
            canary,
            "AnalysisFailed",
            f"canary {canary.name} rolled back after {c.consecutive_failures} consecutive failed "
            f"analyses (failureLimit {limit}): {describe_sample(sample, self.spec)}",
        )
        return True

    def _promote(self, canary: RevisionStatus, why: str) -> None:
        old = self._stable()
        canary.role = "Stable"
        self.st.stable_revision = canary.name
        self.st.canary_revision, self.st.canary = None, None
        if old is not None:
            self._retire(old)
        self.promoted = True
        self._event("Normal", "Promoted", f"revision {canary.name} promoted to stable: {why}")

    # -------------------------------------------------------- traffic, summary

    def _route(self) -> None:
        stable, canary, c = self._stable(), self._canary(), self.st.canary
        canary_weight = 0
        if canary is not None and c is not None and c.step_started_at is not None and self._ready_now(canary):
            canary_weight = self.spec.rollout.steps[c.step].weight
        if stable is None or not self._stable_serves():
            self.st.traffic = []  # the canary never gets more than its step's share
            canary_weight = 0
        elif canary_weight:
            self.st.traffic = [
                TrafficTarget(revision=stable.name, weight=100 - canary_weight),
                TrafficTarget(revision=self.st.canary_revision or "", weight=canary_weight),
            ]
        else:
            self.st.traffic = [TrafficTarget(revision=stable.name, weight=100)]
        if stable is not None and self.st.traffic and stable.name not in self.served:
            self._event("Normal", "Serving", f"revision {stable.name} is ready and receives traffic")
        if c is not None:
            c.weight = canary_weight

    def _summarize(self) -> None:
        st, target = self.st, self.target
        stable, canary = self._stable(), self._canary()
        failed = self._failed(target)
        serving = bool(st.traffic) and stable is not None
        pending = self.st.revision(target)

        if failed is not None:
            phase = "Failed" if failed.reason == "WeightsFailed" or not serving else "RolledBack"
        elif canary is not None:
            phase = "Canary" if canary.weights_ready else "WeightsPending"
        elif serving and stable is not None and stable.name == target:
            phase = "Promoted" if self.promoted or self.previous_phase == "Promoted" else "Ready"
        elif pending is not None and not pending.weights_ready:
            phase = "WeightsPending"
        else:
            phase = "Pending"
        st.phase = phase

        self._condition(*self._ready_condition(stable, serving))
        self._condition(*self._progressing_condition(failed, canary, stable, serving))
        if failed is not None:
            self._condition("Degraded", "True", failed.reason, failed.message)
        else:
            self._condition("Degraded", "False", "AsExpected", "no failed revision")
        self._condition(*self._weights_condition(failed, pending))

    def _condition(self, type_: str, status: ConditionStatus, reason: str, message: str) -> None:
        self.st.conditions = set_condition(
            self.st.conditions, type_, status, reason, message, generation=self.generation, now=self.now
        )

    def _ready_condition(
        self, stable: RevisionStatus | None, serving: bool
    ) -> tuple[str, ConditionStatus, str, str]:
        if serving and stable is not None:
            if stable.ready_replicas > 0:
                return "Ready", "True", "Serving", (
                    f"stable revision {stable.name} serves with {stable.ready_replicas} ready replica(s)"
                )
            return "Ready", "False", "NoReadyReplicas", f"stable revision {stable.name} has no ready replica"
        if stable is None:
            return "Ready", "False", "NoRevision", "no revision can serve yet"
        if not stable.weights_ready:
            return "Ready", "False", "WeightsPending", f"waiting for the weights of revision {stable.name}"
        return "Ready", "False", "ReplicasPending", f"waiting for a ready replica of revision {stable.name}"

    def _progressing_condition(
        self,
        failed: FailedRevision | None,
        canary: RevisionStatus | None,
        stable: RevisionStatus | None,
        serving: bool,
    ) -> tuple[str, ConditionStatus, str, str]:
        target = self.target
        if failed is not None:
            return "Progressing", "False", failed.reason, (
                f"revision {target} failed and is not retried until the spec changes or retry is asked"
            )
        if canary is not None and self.st.canary is not None:
            return "Progressing", "True", *self._canary_progress_reason(canary, self.st.canary)
        if stable is not None and stable.name == target and serving:
            return "Progressing", "False", "RolloutComplete", f"revision {target} is stable"
        if stable is not None and not stable.weights_ready:
            return "Progressing", "True", "WeightsPending", f"pre-pulling the weights of revision {target}"
        return "Progressing", "True", "ReplicasPending", f"waiting for a ready replica of revision {target}"

    def _canary_progress_reason(self, canary: RevisionStatus, c: CanaryStatus) -> tuple[str, str]:
        if not canary.weights_ready:
            return "WeightsPending", f"pre-pulling the weights of canary {canary.name}"
        if c.step_started_at is None or c.weight == 0:
            return "ReplicasPending", f"waiting for a ready replica of canary {canary.name}"
        steps = self.spec.rollout.steps
        sample = describe_sample(c.last_analysis, self.spec) if c.last_analysis else "no analysis yet"
        return "CanaryStep", (
            f"canary {canary.name} at step {c.step + 1}/{len(steps)} with {c.weight}% of traffic; "
            f"last analysis: {sample}"
        )

    def _weights_condition(
        self, failed: FailedRevision | None, pending: RevisionStatus | None
    ) -> tuple[str, ConditionStatus, str, str]:
        if failed is not None and failed.reason == "WeightsFailed":
            return "WeightsReady", "False", "WeightsFailed", failed.message
        if pending is not None and pending.weights_ready:
            return "WeightsReady", "True", "Verified", f"weights of revision {self.target} are verified"
        if failed is not None:
            return "WeightsReady", "False", "NotPulled", (
                f"revision {self.target} failed before its weights were verified"
            )
        facts = self.observed.revisions.get(self.target)
        detail = f": {facts.weights_message}" if facts and facts.weights_message else ""
        return "WeightsReady", "False", "Pulling", f"pre-pulling the weights of revision {self.target}{detail}"


def describe_sample(sample: AnalysisSample, spec: InferenceServiceSpec) -> str:
    """One line with a sample's verdict, its figures and the thresholds they were held to."""
    a = spec.rollout.analysis
    parts = [
        f"{sample.requests} requests (min {a.min_requests})",
        f"error rate {sample.error_rate:.2%} (max {a.max_error_rate:.2%})",
    ]
    if sample.latency_p99_ms is not None and sample.stable_latency_p99_ms is not None:
        diff = sample.latency_p99_ms - sample.stable_latency_p99_ms
        parts.append(
            f"p99 {sample.latency_p99_ms:.0f} ms vs stable {sample.stable_latency_p99_ms:.0f} ms "
            f"({diff:+.0f} ms, max +{a.max_latency_p99_increase_ms:.0f} ms)"
        )
    if sample.ttft_p95_ms is not None:
        parts.append(f"TTFT p95 {sample.ttft_p95_ms:.0f} ms (max {a.max_time_to_first_token_p95_ms:.0f} ms)")
    figures = ", ".join(parts)
    why = f": {'; '.join(sample.reasons)}" if sample.reasons else ""
    return f"{sample.verdict}{why} [{figures}]"
