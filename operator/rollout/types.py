"""What the rollout state machine reads besides spec and status, and what it answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from folio.operator.spec import AnalysisSample, InferenceServiceStatus, ParityReport

# The manual overrides, asked for with `folio.dev/<name>` annotations or `folio promote|abort|retry`.
OVERRIDES = ("promote", "abort", "retry")


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
    ``folio.dev/<name>`` annotations present (``promote``, ``abort``, ``retry``). ``unavailable`` holds
    (reason, message) for each child the spec asks for whose kind the cluster does not serve (a CRD not
    installed): the service runs without it, with Degraded=True saying so.
    """

    now: datetime
    revisions: dict[str, RevisionFacts] = field(default_factory=dict)
    analysis: AnalysisSample | None = None
    parity: ParityReport | None = None  # the parity gate's report for the canary, when one just finished
    overrides: frozenset[str] = frozenset()
    unavailable: tuple[tuple[str, str], ...] = ()


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
