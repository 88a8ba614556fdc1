"""One call of `advance`: a working copy of status, what was observed, and what the call decided.

Every part of the state machine (transitions, canary, traffic, conditions) reads and writes the
same `Pass`; the helpers here answer the questions they all ask (is this revision ready now, has it
served, which one is stable) so that each is answered one way.
"""

from __future__ import annotations

from typing import Literal

from folio.operator.rollout.types import OVERRIDES, Event, Observed, RevisionFacts
from folio.operator.spec import (
    FailedRevision,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RevisionStatus,
    as_utc,
    new_revision,
    now_iso,
    revision_name,
)


class Pass:
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
        self.overrides = set(observed.overrides).intersection(OVERRIDES)
        self.done: set[str] = set()  # overrides acted on
        self.events: list[Event] = []
        self.requeue: list[float] = []  # seconds until something is due
        # "Has served" is read from the traffic status had on entry, so it survives restarts.
        self.served = {t.revision for t in status.traffic if t.weight > 0}
        self.previous_phase = status.phase
        self.promoted = False
        self.waiting: str | None = None  # a new revision held by a RolloutPolicy (`transitions.admit_target`)

    def event(self, type_: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    # ------------------------------------------------------------------- revisions

    def stable(self) -> RevisionStatus | None:
        return self.st.revision(self.st.stable_revision)

    def canary(self) -> RevisionStatus | None:
        return self.st.revision(self.st.canary_revision)

    def failed(self, name: str) -> FailedRevision | None:
        return next((f for f in reversed(self.st.failed_revisions) if f.revision == name), None)

    def take_target(self, role: Literal["Stable", "Canary"]) -> None:
        """List the spec's revision with ``role``; a retiring one brought back must earn traffic again."""
        rev = self.st.revision(self.target)
        if rev is not None:
            rev.role, rev.retire_at = role, None
            return
        self.st.revisions.append(new_revision(self.spec, role, self.at))

    def drop(self, name: str) -> None:
        self.st.revisions = [r for r in self.st.revisions if r.name != name]

    # ----------------------------------------------------------------------- facts

    def facts(self, rev: RevisionStatus) -> RevisionFacts:
        seen = self.observed.revisions.get(rev.name)
        if seen is not None:
            return seen
        return RevisionFacts("ready" if rev.weights_ready else "pending", ready_replicas=rev.ready_replicas)

    def ready_now(self, rev: RevisionStatus) -> bool:
        """Verified weights, a ready replica and no crash loop: a revision that may take a canary's share."""
        facts = self.facts(rev)
        return facts.weights == "ready" and facts.ready_replicas > 0 and not facts.crash_looping

    def stable_serves(self) -> bool:
        """The stable revision may carry traffic: verified weights, and ready now or already serving.

        One that already serves keeps its traffic while its pods restart (the router skips endpoints
        that are not ready), so that a blip never shifts the whole load onto an unproven canary.
        """
        stable = self.stable()
        if stable is None or stable.role != "Stable":
            return False
        facts = self.facts(stable)
        return facts.weights == "ready" and (facts.ready_replicas > 0 or stable.name in self.served)
