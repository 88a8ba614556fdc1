"""A small driver for the rollout state machine: a clock, the facts a cluster would report, and status."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from folio.operator.rollout import Decision, Event, Observed, RevisionFacts, advance
from folio.operator.spec import (
    AnalysisSample,
    InferenceServiceSpec,
    InferenceServiceStatus,
    ParityReport,
    now_iso,
    revision_name,
)

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=timezone.utc)
READY = RevisionFacts("ready", ready_replicas=1)


def make_spec(tag: str = "a", **rollout: Any) -> InferenceServiceSpec:
    """A spec whose revision is determined by ``tag`` (it goes into the digest)."""
    digest = "sha256:" + (tag.encode().hex() * 64)[:64]
    body: dict[str, Any] = {"model": {"source": "file:///models/m", "digest": digest}}
    body["rollout"] = {
        "steps": [{"weight": 10, "pause": "1m"}, {"weight": 50, "pause": "1m"}],
        "analysis": {"interval": "30s", "minRequests": 10, "failureLimit": 2},
        "drainPeriod": "30s",
        **rollout,
    }
    return InferenceServiceSpec.model_validate(body)


def sample(verdict: str, at: datetime, requests: int = 100, errors: int = 0, **kw: Any) -> AnalysisSample:
    return AnalysisSample(
        at=now_iso(at), verdict=verdict, requests=requests, errors=errors,
        error_rate=errors / requests if requests else 0.0, **kw,
    )


@dataclass
class Sim:
    spec: InferenceServiceSpec
    status: InferenceServiceStatus = field(default_factory=InferenceServiceStatus)
    now: datetime = T0
    generation: int = 1
    facts: dict[str, RevisionFacts] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    last: Decision | None = None

    @property
    def rev(self) -> str:
        return revision_name(self.spec)

    def apply(self, spec: InferenceServiceSpec) -> None:
        self.spec = spec
        self.generation += 1

    def tick(
        self,
        seconds: float = 0.0,
        *,
        analysis: AnalysisSample | None = None,
        overrides: frozenset[str] = frozenset(),
        parity: ParityReport | None = None,
    ) -> Decision:
        self.now += timedelta(seconds=seconds)
        observed = Observed(now=self.now, revisions=dict(self.facts), analysis=analysis, overrides=overrides,
                            parity=parity)
        self.last = advance(self.spec, self.generation, self.status, observed)
        self.status = self.last.status
        self.events += self.last.events
        return self.last

    def weights(self) -> dict[str, int]:
        return {t.revision: t.weight for t in self.status.traffic}

    def condition(self, type_: str) -> tuple[str, str]:
        c = self.status.condition(type_)
        assert c is not None, type_
        return c.status, c.reason

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


def deployed(spec: InferenceServiceSpec | None = None) -> Sim:
    """A Sim whose first revision is stable and serving."""
    sim = Sim(spec or make_spec("a"))
    sim.facts[sim.rev] = READY
    sim.tick()
    assert sim.weights() == {sim.rev: 100}
    return sim
