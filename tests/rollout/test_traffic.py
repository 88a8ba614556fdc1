"""Who gets traffic: directed tests for each rule in `rollout/traffic.py` (and what it reads in `state.py`)."""

from __future__ import annotations

from folio.operator.rollout import RevisionFacts
from tests.rollout.conftest import Rollout
from tests.rollout.helpers import READY, Sim, make_spec


def test_a_canary_that_loses_its_replicas_mid_step_gives_its_share_back(at_step_one: Rollout) -> None:
    sim, stable, canary = at_step_one.sim, at_step_one.stable, at_step_one.canary
    sim.facts[canary] = RevisionFacts("ready", ready_replicas=0)
    sim.tick(5)
    assert sim.weights() == {stable: 100}
    assert sim.status.canary is not None and sim.status.canary.weight == 0
    assert sim.status.canary_revision == canary, "it waits for its replicas; it has not failed"
    sim.facts[canary] = READY
    sim.tick(5)
    assert sim.weights() == {stable: 90, canary: 10}, "back at the same step's share"
    assert sim.status.canary.step == 0


def test_a_canary_whose_weights_are_no_longer_verified_gets_nothing(at_step_one: Rollout) -> None:
    sim, stable, canary = at_step_one.sim, at_step_one.stable, at_step_one.canary
    sim.facts[canary] = RevisionFacts("pending", ready_replicas=1)
    sim.tick(5)
    assert sim.weights() == {stable: 100}


def test_a_serving_stable_keeps_its_traffic_while_its_pods_restart(at_step_one: Rollout) -> None:
    """A blip of the stable's replicas must never shift the whole load onto an unproven canary."""
    sim, stable, canary = at_step_one.sim, at_step_one.stable, at_step_one.canary
    sim.facts[stable] = RevisionFacts("ready", ready_replicas=0)
    sim.tick(5)
    assert sim.weights() == {stable: 90, canary: 10}
    assert sim.condition("Ready") == ("False", "NoReadyReplicas")


def test_without_a_stable_that_may_serve_the_canary_gets_no_more_than_nothing(at_step_one: Rollout) -> None:
    sim, stable = at_step_one.sim, at_step_one.stable
    sim.facts[stable] = RevisionFacts("pending")  # its weights are not verified (say, the cache was lost)
    sim.tick(5)
    assert sim.status.traffic == [], "never 100% on the canary"
    assert sim.status.canary is not None and sim.status.canary.weight == 0


def test_a_first_revision_gets_traffic_only_with_a_ready_replica() -> None:
    sim = Sim(make_spec("a"))
    sim.facts[sim.rev] = RevisionFacts("ready", ready_replicas=0)
    sim.tick()
    assert sim.status.traffic == []
    sim.facts[sim.rev] = READY
    sim.tick(1)
    sim.tick(1)
    assert sim.weights() == {sim.rev: 100}
    assert sim.reasons().count("Serving") == 1, "one Serving Event, when it first gets traffic"


def test_the_canary_gets_exactly_its_step_s_weight(at_step_one: Rollout) -> None:
    sim, stable, canary = at_step_one.sim, at_step_one.stable, at_step_one.canary
    weights = [s.weight for s in sim.spec.rollout.steps]
    assert sim.weights()[canary] == weights[0] and sim.weights()[stable] == 100 - weights[0]
