"""The first revision: no canary, straight to stable once its weights and a replica are ready."""

from __future__ import annotations

from folio.operator.rollout import RevisionFacts
from tests.rollout.helpers import READY, Sim, make_spec


def test_waits_for_weights_then_replicas_then_serves_everything() -> None:
    sim = Sim(make_spec("a"))
    sim.tick()
    assert sim.status.phase == "WeightsPending"
    assert sim.status.traffic == []
    assert sim.status.stable_revision == sim.rev
    assert [r.role for r in sim.status.revisions] == ["Stable"]
    assert sim.condition("Ready") == ("False", "WeightsPending")
    assert sim.condition("WeightsReady") == ("False", "Pulling")
    assert sim.condition("Progressing") == ("True", "WeightsPending")
    assert sim.condition("Degraded") == ("False", "AsExpected")

    sim.facts[sim.rev] = RevisionFacts("ready", ready_replicas=0)
    sim.tick(10)
    assert sim.status.phase == "Pending"
    assert sim.status.traffic == []
    assert sim.condition("WeightsReady") == ("True", "Verified")
    assert sim.condition("Ready") == ("False", "ReplicasPending")

    sim.facts[sim.rev] = READY
    sim.tick(10)
    assert sim.status.phase == "Ready"
    assert sim.weights() == {sim.rev: 100}
    assert sim.condition("Ready") == ("True", "Serving")
    assert sim.condition("Progressing") == ("False", "RolloutComplete")
    assert "Serving" in sim.reasons()
    assert sim.last is not None and sim.last.requeue_after is None


def test_conditions_carry_generation_and_move_transition_time_only_on_flips() -> None:
    sim = Sim(make_spec("a"))
    sim.tick()
    first = {c.type: c.last_transition_time for c in sim.status.conditions}
    sim.facts[sim.rev] = RevisionFacts("pending", weights_message="3/10 files")
    sim.tick(30)
    assert {c.type: c.last_transition_time for c in sim.status.conditions} == first
    weights = sim.status.condition("WeightsReady")
    assert weights is not None and "3/10 files" in weights.message
    sim.facts[sim.rev] = READY
    sim.generation = 7
    sim.tick(30)
    assert all(c.observed_generation == 7 for c in sim.status.conditions)
    assert sim.status.observed_generation == 7
    ready = sim.status.condition("Ready")
    degraded = sim.status.condition("Degraded")
    assert ready is not None and ready.last_transition_time == "2026-03-01T12:01:00Z"
    assert degraded is not None and degraded.last_transition_time == first["Degraded"]


def test_replica_and_rollout_changes_keep_the_revision() -> None:
    sim = Sim(make_spec("a"))
    sim.facts[sim.rev] = READY
    sim.tick()
    before = [r.model_dump() for r in sim.status.revisions]
    spec = make_spec("a", drainPeriod="5m").model_copy(update={"replicas": 4})
    sim.apply(spec)
    sim.tick(5)
    assert [r.model_dump() for r in sim.status.revisions] == before
    assert sim.status.canary_revision is None
    assert sim.weights() == {sim.rev: 100}


def test_weights_mismatch_fails_the_first_revision_and_never_serves() -> None:
    sim = Sim(make_spec("a"))
    sim.facts[sim.rev] = RevisionFacts("failed", weights_message="digest mismatch: expected sha256:aa…")
    sim.tick()
    assert sim.status.traffic == []
    assert sim.status.phase == "Failed"
    assert sim.condition("WeightsReady") == ("False", "WeightsFailed")
    assert sim.condition("Degraded") == ("True", "WeightsFailed")
    assert sim.condition("Ready") == ("False", "NoRevision")
    assert [f.revision for f in sim.status.failed_revisions] == [sim.rev]
    # replicas turning up later change nothing: the revision stays failed
    sim.facts[sim.rev] = RevisionFacts("ready", ready_replicas=1)
    sim.tick(60)
    assert sim.status.traffic == []
    # a fixed spec (a different revision) starts over as the stable revision
    sim.apply(make_spec("b"))
    sim.facts[sim.rev] = READY
    sim.tick(5)
    assert sim.weights() == {sim.rev: 100}
    assert sim.condition("Degraded") == ("False", "AsExpected")


def test_a_newer_revision_replaces_one_that_never_served() -> None:
    sim = Sim(make_spec("a"))
    sim.tick()
    old = sim.rev
    sim.apply(make_spec("b"))
    sim.tick(5)
    assert [r.name for r in sim.status.revisions] == [sim.rev]
    assert sim.status.stable_revision == sim.rev != old
    assert sim.status.canary_revision is None
