"""The autoscaler's replicas shared over revisions, and the serving plan taking its counts from them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rich.console import Console

from folio.operator.autoscaling.share import promotion_ready, revision_replicas, service_replicas
from folio.operator.local.render import status_table
from folio.operator.rollout import RevisionFacts
from folio.operator.serving.plan import Placement, plan
from folio.operator.spec import (
    AutoscalingSpec,
    AutoscalingStatus,
    CanaryStatus,
    InferenceServiceStatus,
    RevisionStatus,
    TrafficTarget,
)
from tests.rollout.helpers import READY, deployed, sample
from tests.rollout.helpers import make_spec as rollout_spec
from tests.serving.helpers import make_spec, revision

AUTO = {"minReplicas": 0, "maxReplicas": 10, "target": 4}


def status(desired: int | None, *traffic: tuple[str, int], canary: str | None = None, step: int = 0,
           revisions: list[RevisionStatus] | None = None) -> InferenceServiceStatus:
    return InferenceServiceStatus(
        revisions=revisions or [],
        traffic=[TrafficTarget(revision=r, weight=w) for r, w in traffic],
        stable_revision="s", canary_revision=canary,
        canary=CanaryStatus(step=step, weight=dict(traffic).get(canary or "", 0),
                            step_started_at="2026-12-03T00:00:00Z") if canary else None,
        autoscaling=None if desired is None else AutoscalingStatus(desired_replicas=desired),
    )


def rev(name: str, role: str, ready: int = 0) -> RevisionStatus:
    spec = make_spec()
    return RevisionStatus(name=name, role=role, model=spec.model, image="i", ready_replicas=ready)  # type: ignore[arg-type]


def test_without_autoscaling_every_revision_runs_spec_replicas() -> None:
    spec = make_spec(replicas=3)
    assert revision_replicas(spec, status(7, ("s", 100)), rev("s", "Stable")) == 3
    assert promotion_ready(spec, status(7), 0)


def test_stable_takes_all_and_a_new_service_starts_with_one() -> None:
    spec = make_spec(autoscaling=AUTO)
    assert revision_replicas(spec, status(None), rev("s", "Stable")) == 1
    assert revision_replicas(spec, status(6, ("s", 100)), rev("s", "Stable")) == 6
    assert revision_replicas(spec, status(0, ("s", 100)), rev("s", "Stable")) == 0  # scaled to zero
    assert service_replicas(make_spec(autoscaling={**AUTO, "maxReplicas": 4}), status(6)) == 4


def test_canary_follows_its_share_at_least_one_and_gets_everything_before_promotion() -> None:
    spec = make_spec(autoscaling=AUTO)  # steps 5, 25, 50
    s = status(8, ("s", 75), ("c", 25), canary="c", step=1)
    assert revision_replicas(spec, s, rev("c", "Canary")) == 2
    assert revision_replicas(spec, s, rev("s", "Stable")) == 6
    s = status(8, ("s", 95), ("c", 5), canary="c", step=0)
    assert revision_replicas(spec, s, rev("c", "Canary")) == 1
    s = status(0, ("s", 95), ("c", 5), canary="c", step=0)
    assert revision_replicas(spec, s, rev("s", "Stable")) == 1 and revision_replicas(spec, s, rev("c", "Canary")) == 1
    last = status(8, ("s", 50), ("c", 50), canary="c", step=2)
    assert revision_replicas(spec, last, rev("c", "Canary")) == 8  # the whole load before all traffic moves
    assert revision_replicas(spec, last, rev("s", "Stable")) == 4
    assert not promotion_ready(spec, last, 7) and promotion_ready(spec, last, 8)


def test_retiring_keeps_what_serves_its_last_requests() -> None:
    spec = make_spec(autoscaling=AUTO)
    assert revision_replicas(spec, status(8, ("c", 100)), rev("old", "Retiring", ready=3)) == 3


def test_the_plan_takes_its_replicas_from_the_decision() -> None:
    spec = make_spec(autoscaling=AUTO)
    stable = revision(spec)
    s = InferenceServiceStatus(revisions=[stable], traffic=[TrafficTarget(revision=stable.name, weight=100)],
                               stable_revision=stable.name, autoscaling=AutoscalingStatus(desired_replicas=5))
    serving = plan("chat", spec, s, Placement.cluster())
    assert [r.replicas for r in serving.revisions] == [5]
    holding = serving.router.holding
    assert holding is not None and holding.max_held_requests == 256 and holding.hold_timeout == 300
    assert holding.release_per_replica == 4
    pulling = revision(spec, weights_ready=False)
    assert plan("chat", spec, s.model_copy(update={"revisions": [pulling]}), Placement.cluster()).revisions[0].replicas == 0


def test_promotion_waits_for_the_canary_to_have_the_replicas_the_load_needs() -> None:
    def autoscaled(tag: str) -> Any:
        return rollout_spec(tag).model_copy(update={"autoscaling": AutoscalingSpec(minReplicas=1, maxReplicas=8)})

    sim = deployed(autoscaled("a"))
    sim.status.autoscaling = AutoscalingStatus(desired_replicas=4)
    stable = sim.rev
    sim.apply(autoscaled("b"))
    sim.tick(1)
    canary = sim.rev
    sim.facts[canary] = READY
    sim.tick(1)
    sim.tick(61, analysis=sample("Pass", sim.now + timedelta(seconds=61)))
    assert sim.weights() == {stable: 50, canary: 50}  # the last step: the canary is brought to 4 replicas
    sim.tick(61, analysis=sample("Pass", sim.now + timedelta(seconds=61)))
    assert sim.weights() == {stable: 50, canary: 50}, "one ready canary replica cannot take the whole load"
    sim.facts[canary] = RevisionFacts("ready", ready_replicas=4)
    sim.tick(5, analysis=sample("Pass", sim.now + timedelta(seconds=5)))
    assert sim.weights() == {canary: 100} and sim.status.stable_revision == canary


def test_status_table_shows_the_decision() -> None:
    console = Console(width=200, record=True)
    console.print(status_table("chat", status(3, ("s", 100)).model_copy(update={"autoscaling": AutoscalingStatus(
        desired_replicas=3, current_replicas=1, metric="InFlight", reason="scaled up: InFlight 9 at target 4")})))
    text = console.export_text()
    assert "autoscaling (InFlight): 1 ready, 3 desired; scaled up: InFlight 9 at target 4" in text
