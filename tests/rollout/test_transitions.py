"""Revisions admitted, superseded, failed and retired: directed tests for `rollout/transitions.py`."""

from __future__ import annotations

from folio.operator.rollout import RevisionFacts
from folio.operator.rollout.transitions import FAILED_HISTORY
from tests.rollout.conftest import Rollout, start_canary
from tests.rollout.helpers import READY, deployed, make_spec


def test_a_stable_that_has_served_is_not_failed_by_a_crash_loop(at_step_one: Rollout) -> None:
    """Only the canary, or a stable that never served, fails on the way in: a serving stable is kept."""
    sim, stable, canary = at_step_one.sim, at_step_one.stable, at_step_one.canary
    sim.facts[stable] = RevisionFacts("ready", ready_replicas=1, crash_looping=True)
    sim.tick(5)
    assert sim.status.stable_revision == stable and sim.status.failed_revisions == []
    assert sim.weights() == {stable: 90, canary: 10}


def test_failed_revisions_keep_the_most_recent_ten() -> None:
    sim = deployed()
    aborted = []
    for n in range(FAILED_HISTORY + 2):
        _, canary = start_canary(sim, f"t{n}")
        sim.tick(1, overrides=frozenset({"abort"}))
        aborted.append(canary)
    assert [f.revision for f in sim.status.failed_revisions] == aborted[-FAILED_HISTORY:]


def test_a_drained_revision_goes_when_its_drain_is_over() -> None:
    sim = deployed(make_spec("a", drainPeriod="30s"))
    stable, canary = start_canary(sim)
    sim.facts[canary] = READY
    decision = sim.tick(1, overrides=frozenset({"promote"}))
    assert {r.name: r.role for r in sim.status.revisions} == {canary: "Stable", stable: "Retiring"}
    assert decision.requeue_after == 30.0, "called back when the drain ends"
    decision = sim.tick(20)
    assert decision.requeue_after == 10.0
    assert stable in {r.name for r in sim.status.revisions}
    sim.tick(10)
    assert [r.name for r in sim.status.revisions] == [canary]


def test_a_superseded_canary_brought_back_starts_over_and_earns_its_traffic(at_step_one: Rollout) -> None:
    sim, stable, first = at_step_one.sim, at_step_one.stable, at_step_one.canary
    sim.apply(make_spec("c"))
    sim.tick(1)
    assert {r.name: r.role for r in sim.status.revisions}[first] == "Retiring"
    sim.apply(make_spec("b"))  # back to the first canary's spec, while it drains
    sim.facts[first] = RevisionFacts("ready", ready_replicas=0)
    sim.tick(1)
    back = sim.status.revision(first)
    assert back is not None and (back.role, back.retire_at) == ("Canary", None)
    assert sim.weights() == {stable: 100}, "no traffic before it is ready again"
    sim.facts[first] = READY
    sim.tick(60)  # past the drain it was on: it stays
    assert sim.weights() == {stable: 90, first: 10}
    assert sim.status.canary is not None and sim.status.canary.step == 0


def test_retry_clears_only_the_spec_s_revision(at_step_one: Rollout) -> None:
    sim, canary = at_step_one.sim, at_step_one.canary
    sim.tick(1, overrides=frozenset({"abort"}))
    _, other = start_canary(sim, "c")
    sim.tick(1, overrides=frozenset({"abort"}))
    sim.apply(make_spec("b"))
    sim.tick(1, overrides=frozenset({"retry"}))
    assert [f.revision for f in sim.status.failed_revisions] == [other]
    assert sim.status.canary_revision == canary


def test_a_revision_held_by_a_rollout_policy_waits_with_stable_serving() -> None:
    """`Observed.waiting` (a RolloutPolicy's gate): no canary starts, stable keeps 100%, Progressing says why."""
    from folio.operator.rollout import Observed, advance

    sim = deployed()
    stable = sim.rev
    sim.apply(make_spec("b"))
    held = Observed(now=sim.now, revisions=dict(sim.facts), waiting="revision b waits for RolloutPolicy fleet")
    d = advance(sim.spec, sim.generation, sim.status, held)
    assert d.status.canary_revision is None and d.status.stable_revision == stable
    assert [(t.revision, t.weight) for t in d.status.traffic] == [(stable, 100)]
    progressing = d.status.condition("Progressing")
    assert progressing is not None and (progressing.status, progressing.reason) == ("True", "WaitingForRolloutPolicy")
    assert "RolloutPolicy fleet" in progressing.message
    sim.status = d.status
    sim.tick(1)  # admitted: the canary starts
    assert sim.status.canary_revision == sim.rev
