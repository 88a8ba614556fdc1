"""What the rollout state machine reads besides spec and status, and what it answers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from folio.operator.spec import AnalysisSample, InferenceServiceStatus, ParityReport, RolloutStatus

# The manual overrides, asked for with `folio.dev/<name>` annotations or `folio promote|abort|retry`.
OVERRIDES = ("promote", "abort", "retry")


def nothing_to_act_on(override: str, status: RolloutStatus | None, target: str | None) -> str | None:
    """Why the rollout would ignore ``override`` now (its NothingTo* events), for the command that asks
    for it; None when there is something to act on. ``target``: the spec's revision (None: unknown)."""
    if override in ("promote", "abort") and (status is None or status.canary_revision is None):
        return f"no canary in progress: nothing to {override}"
    if override == "retry" and target is not None:
        failed = any(f.revision == target for f in (status.failed_revisions if status else []))
        paused = (status is not None and status.canary_revision == target and status.canary is not None
                  and status.canary.paused is not None)  # retry analyses a paused canary's step afresh
        if not failed and not paused:
            return f"revision {target} has not failed: nothing to retry"
    return None


@dataclass(frozen=True)
class RevisionFacts:
    """What the caller saw of one revision just now."""

    weights: Literal["pending", "ready", "failed"]
    weights_message: str = ""
    ready_replicas: int = 0
    crash_looping: bool = False


@dataclass(frozen=True)
class AdapterObserved:
    """What the caller saw of one adapter (`folio.operator.rollout.adapters`): its revisions' facts (weights:
    the adapter's pre-pull, ready replicas: the engines that have loaded it), its analysis sample and parity
    report, and the overrides asked for it."""

    revisions: dict[str, RevisionFacts] = field(default_factory=dict)
    analysis: AnalysisSample | None = None
    parity: ParityReport | None = None
    overrides: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Observed:
    """Everything ``advance`` may look at besides spec and status.

    ``revisions`` may omit a revision; its last known state in status is used then. ``analysis`` is
    the latest sample for the canary; one with an ``at`` already recorded in status is not counted
    twice, so callers may pass the same sample on every call. ``overrides`` holds the names of the
    ``folio.dev/<name>`` annotations present (``promote``, ``abort``, ``retry``). ``waiting`` says why a
    RolloutPolicy holds a new revision before its canary (None: nothing holds it). ``unavailable`` holds
    (reason, message) for each child the spec asks for whose kind the cluster does not serve (a CRD not
    installed): the service runs without it, with Degraded=True saying so.
    """

    now: datetime
    revisions: dict[str, RevisionFacts] = field(default_factory=dict)
    analysis: AnalysisSample | None = None
    parity: ParityReport | None = None  # the parity gate's report for the canary, when one just finished
    overrides: frozenset[str] = frozenset()
    unavailable: tuple[tuple[str, str], ...] = ()
    adapters: Mapping[str, AdapterObserved] = field(default_factory=dict)  # by adapter name
    # Why a new revision may not start its canary now (a RolloutPolicy holds it: `folio.operator.fleet.gate`);
    # None: it may. The stable revision keeps serving while it waits.
    waiting: str | None = None


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
    # Seconds until the next time-based transition (a step's pause ending, a drain ending) or the
    # next analysis; None when nothing will happen without a new observation.
    requeue_after: float | None
