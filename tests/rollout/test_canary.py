"""Canary scenarios: promotion, rollback, supersede, overrides, restarts."""

from __future__ import annotations

from datetime import timedelta

from folio.operator.rollout import RevisionFacts
from folio.operator.spec import InferenceServiceStatus
from tests.rollout.conftest import Rollout, start_canary
from tests.rollout.helpers import READY, Sim, deployed, make_spec, sample


def test_full_canary_walks_every_step_and_promotes() -> None:
    sim = deployed()
    stable, canary = start_canary(sim)
    assert sim.status.canary_revision == canary
    assert sim.status.phase == "WeightsPending"
    assert sim.weights() == {stable: 100}

    sim.facts[canary] = RevisionFacts("ready", ready_replicas=0)
    sim.tick(5)
    assert sim.weights() == {stable: 100}, "no traffic before a ready replica"
    sim.facts[canary] = READY
    sim.tick(5)
    assert sim.weights() == {stable: 90, canary: 10}
    assert sim.status.canary is not None and sim.status.canary.weight == 10
    assert sim.condition("Progressing") == ("True", "CanaryStep")

    # pause over but no passing sample yet: the step holds (inconclusive is not a pass)
    sim.tick(61, analysis=sample("Inconclusive", sim.now + timedelta(seconds=61), requests=3))
    assert sim.weights() == {stable: 90, canary: 10}
    sim.tick(30, analysis=sample("Pass", sim.now + timedelta(seconds=30)))
    assert sim.weights() == {stable: 50, canary: 50}
    assert sim.last is not None and sim.last.requeue_after == 30.0

    sim.tick(30, analysis=sample("Pass", sim.now + timedelta(seconds=30)))
    assert sim.weights() == {stable: 50, canary: 50}, "pause of step 2 not over"
    sim.tick(31, analysis=sample("Pass", sim.now + timedelta(seconds=31)))
    assert sim.status.phase == "Promoted"
    assert sim.weights() == {canary: 100}
    assert sim.status.stable_revision == canary and sim.status.canary_revision is None
    roles = {r.name: r.role for r in sim.status.revisions}
    assert roles == {canary: "Stable", stable: "Retiring"}
    assert sim.last is not None and sim.last.requeue_after == 30.0

    sim.tick(30)
    assert [r.name for r in sim.status.revisions] == [canary]
    assert sim.status.phase == "Promoted"
    assert sim.condition("Progressing") == ("False", "RolloutComplete")
    assert sim.reasons()[-3:] == ["CanaryStep", "Promoted", "Retired"]


def test_error_breach_rolls_back_within_failure_limit_intervals(at_step_one: Rollout) -> None:
    sim, stable, canary = at_step_one.sim, at_step_one.stable, at_step_one.canary
    began = sim.now
    figures = {"requests": 200, "errors": 40, "reasons": ["error rate 20.00% exceeds 1.00%"]}
    sim.tick(30, analysis=sample("Fail", sim.now + timedelta(seconds=30), **figures))
    assert sim.weights() == {stable: 90, canary: 10}
    assert sim.status.canary is not None and sim.status.canary.consecutive_failures == 1
    sim.tick(30, analysis=sample("Fail", sim.now + timedelta(seconds=30), **figures))
    interval, limit = 30, 2
    assert (sim.now - began).total_seconds() <= limit * interval + interval

    assert sim.status.phase == "RolledBack"
    assert sim.weights() == {stable: 100}
    assert sim.status.canary_revision is None and sim.status.canary is None
    assert {r.name: r.role for r in sim.status.revisions} == {stable: "Stable", canary: "Failed"}
    [failed] = sim.status.failed_revisions
    assert failed.revision == canary and failed.reason == "AnalysisFailed"
    assert failed.last_analysis is not None  # the deciding figures, structured for tools
    assert (failed.last_analysis.verdict, failed.last_analysis.errors) == ("Fail", 40)
    degraded = sim.status.condition("Degraded")
    assert degraded is not None and degraded.status == "True"
    for figure in ("200 requests", "error rate 20.00%", "max 1.00%", "failureLimit 2"):
        assert figure in degraded.message
    assert "RolledBack" in sim.reasons()
    assert sim.condition("Ready") == ("True", "Serving")

    # not retried while the spec stays the same, however long we wait
    sim.tick(600, analysis=sample("Pass", sim.now + timedelta(seconds=600)))
    assert sim.weights() == {stable: 100}
    assert sim.status.canary_revision is None

    # retry brings it back as a canary from step one
    d = sim.tick(1, overrides=frozenset({"retry"}))
    assert d.overrides_done == {"retry"}
    assert sim.status.canary_revision == canary
    assert sim.status.failed_revisions == []
    assert sim.weights() == {stable: 90, canary: 10}
    assert sim.condition("Degraded") == ("False", "AsExpected")


def test_a_pass_resets_the_failure_count(at_step_one: Rollout) -> None:
    sim, canary = at_step_one.sim, at_step_one.canary
    for verdict in ("Fail", "Pass", "Fail", "Inconclusive"):
        sim.tick(30, analysis=sample(verdict, sim.now + timedelta(seconds=30)))
        assert sim.status.canary_revision == canary
    sim.tick(30, analysis=sample("Fail", sim.now + timedelta(seconds=30)))
    assert sim.status.phase == "RolledBack"


def test_the_same_sample_is_counted_once(at_step_one: Rollout) -> None:
    sim = at_step_one.sim
    bad = sample("Fail", sim.now + timedelta(seconds=30))
    for _ in range(5):
        sim.tick(5, analysis=bad)
    assert sim.status.canary is not None and sim.status.canary.consecutive_failures == 1


def test_crash_looping_canary_is_rolled_back(at_step_one: Rollout) -> None:
    sim, stable, canary = at_step_one.sim, at_step_one.stable, at_step_one.canary
    sim.facts[canary] = RevisionFacts("ready", ready_replicas=0, crash_looping=True)
    sim.tick(10)
    assert sim.weights() == {stable: 100}
    assert sim.status.failed_revisions[-1].reason == "CrashLoopBackOff"
    assert sim.condition("Degraded") == ("True", "CrashLoopBackOff")


def test_canary_weights_failure_never_takes_traffic() -> None:
    sim = deployed()
    stable, canary = start_canary(sim)
    sim.facts[canary] = RevisionFacts("failed", weights_message="digest mismatch", ready_replicas=1)
    sim.tick(5)
    assert sim.weights() == {stable: 100}
    assert sim.status.phase == "Failed"
    assert sim.condition("WeightsReady") == ("False", "WeightsFailed")
    assert sim.condition("Ready") == ("True", "Serving")


def test_newer_revision_supersedes_the_canary() -> None:
    sim = deployed()
    stable, first = start_canary(sim, "b")
    sim.facts[first] = READY
    sim.tick(1)
    assert sim.weights() == {stable: 90, first: 10}
    sim.apply(make_spec("c"))
    second = sim.rev
    sim.tick(1)
    assert sim.weights() == {stable: 100}, "traffic goes back to stable before the new canary"
    assert sim.status.canary_revision == second
    roles = {r.name: r.role for r in sim.status.revisions}
    assert roles == {stable: "Stable", first: "Retiring", second: "Canary"}
    assert "Superseded" in sim.reasons()
    assert sim.status.failed_revisions == []
    sim.facts[second] = READY
    sim.tick(30)
    assert sim.weights() == {stable: 90, second: 10}
    assert first not in {r.name for r in sim.status.revisions}


def test_superseding_a_canary_without_traffic_drops_it_at_once() -> None:
    sim = deployed()
    stable, _ = start_canary(sim, "b")
    sim.apply(make_spec("c"))
    sim.tick(1)
    assert {r.name for r in sim.status.revisions} == {stable, sim.rev}


def test_going_back_to_the_stable_spec_ends_the_canary() -> None:
    sim = deployed(make_spec("a"))
    stable, canary = start_canary(sim, "b")
    sim.facts[canary] = READY
    sim.tick(1)
    sim.apply(make_spec("a"))
    sim.tick(1)
    assert sim.weights() == {stable: 100}
    assert sim.status.canary_revision is None
    assert sim.status.phase == "Ready"
    assert sim.condition("Progressing") == ("False", "RolloutComplete")


def test_promote_override_skips_the_remaining_steps() -> None:
    sim = deployed()
    stable, canary = start_canary(sim)
    d = sim.tick(1, overrides=frozenset({"promote"}))
    assert d.overrides_done == frozenset(), "waits until the canary can take traffic"
    assert sim.weights() == {stable: 100}
    sim.facts[canary] = READY
    d = sim.tick(1, overrides=frozenset({"promote"}))
    assert d.overrides_done == {"promote"}
    assert sim.weights() == {canary: 100}
    assert sim.status.phase == "Promoted"


def test_abort_override_rolls_back(at_step_one: Rollout) -> None:
    sim, stable = at_step_one.sim, at_step_one.stable
    d = sim.tick(1, overrides=frozenset({"abort"}))
    assert d.overrides_done == {"abort"}
    assert sim.weights() == {stable: 100}
    assert sim.status.failed_revisions[-1].reason == "Aborted"
    assert sim.condition("Degraded") == ("True", "Aborted")


def test_overrides_with_nothing_to_act_on_are_cleared_with_a_warning() -> None:
    sim = deployed()
    d = sim.tick(1, overrides=frozenset({"promote", "abort", "retry", "unrelated"}))
    assert d.overrides_done == {"promote", "abort", "retry"}
    assert {e.reason for e in d.events} == {"NothingToPromote", "NothingToAbort", "NothingToRetry"}
    assert all(e.type == "Warning" for e in d.events)


def test_restart_mid_canary_continues_from_status_alone(at_step_one: Rollout) -> None:
    sim, stable, canary = at_step_one.sim, at_step_one.stable, at_step_one.canary
    sim.tick(61, analysis=sample("Pass", sim.now + timedelta(seconds=61)))
    assert sim.weights() == {stable: 50, canary: 50}
    wire = sim.status.to_wire()
    restarted = Sim(sim.spec, InferenceServiceStatus.model_validate(wire), sim.now, sim.generation)
    restarted.facts = {}  # a fresh operator has seen nothing yet: last known state is used
    restarted.tick(1)
    assert restarted.weights() == {stable: 50, canary: 50}
    assert restarted.status.canary is not None and restarted.status.canary.step == 1


def test_without_steps_a_ready_canary_is_promoted_at_once() -> None:
    sim = deployed(make_spec("a", steps=[]))
    stable = sim.rev
    sim.apply(make_spec("b", steps=[], drainPeriod="0s"))
    sim.tick(1)
    assert sim.weights() == {stable: 100}
    sim.facts[sim.rev] = READY
    sim.tick(1)
    assert sim.weights() == {sim.rev: 100}
    assert [r.name for r in sim.status.revisions] == [sim.rev], "no drain period: the old stable goes at once"


def test_removing_steps_mid_canary_keeps_the_step_index_valid(at_step_one: Rollout) -> None:
    sim, stable, canary = at_step_one.sim, at_step_one.stable, at_step_one.canary
    sim.tick(61, analysis=sample("Pass", sim.now + timedelta(seconds=61)))
    assert sim.status.canary is not None and sim.status.canary.step == 1
    sim.apply(make_spec("b", steps=[{"weight": 20, "pause": "1m"}]))  # same revision, fewer steps
    sim.tick(1)
    assert sim.weights() == {stable: 80, canary: 20}
    assert sim.status.canary_revision == canary


def test_reverting_the_spec_after_a_rollback_clears_degraded() -> None:
    sim = deployed(make_spec("a"))
    stable, canary = start_canary(sim, "b")
    sim.tick(1, overrides=frozenset({"abort"}))
    assert sim.condition("Degraded") == ("True", "Aborted")
    assert canary in {f.revision for f in sim.status.failed_revisions}
    sim.apply(make_spec("a"))
    sim.tick(1)
    assert sim.condition("Degraded") == ("False", "AsExpected")
    assert sim.status.phase == "Ready" and sim.weights() == {stable: 100}
    assert [r.name for r in sim.status.revisions] == [stable], "the failed revision is no longer listed"


# ------------------------------------------------------------------ directed: one rule each


def test_a_pass_from_the_previous_step_does_not_end_the_next(at_step_one: Rollout) -> None:
    sim, stable, canary = at_step_one.sim, at_step_one.stable, at_step_one.canary
    sim.tick(61, analysis=sample("Pass", sim.now + timedelta(seconds=61)))
    assert sim.weights() == {stable: 50, canary: 50}
    sim.tick(120)  # the second step's pause is long over, but nothing was measured during it
    assert sim.weights() == {stable: 50, canary: 50}
    sim.tick(1, analysis=sample("Pass", sim.now + timedelta(seconds=1)))
    assert sim.weights() == {canary: 100}


def test_a_sample_from_before_the_canary_had_traffic_is_not_counted(at_step_one: Rollout) -> None:
    sim = at_step_one.sim
    assert sim.status.canary is not None and sim.status.canary.step_started_at is not None
    early = sample("Fail", sim.now - timedelta(seconds=5))
    sim.tick(1, analysis=early)
    assert sim.status.canary.consecutive_failures == 0 and sim.status.canary.last_analysis is None


def test_an_older_sample_than_the_last_one_is_not_counted(at_step_one: Rollout) -> None:
    sim = at_step_one.sim
    sim.tick(30, analysis=sample("Pass", sim.now + timedelta(seconds=30)))
    sim.tick(5, analysis=sample("Fail", sim.now - timedelta(seconds=10)))
    assert sim.status.canary is not None and sim.status.canary.consecutive_failures == 0
    assert sim.status.canary.last_analysis is not None and sim.status.canary.last_analysis.verdict == "Pass"


def test_a_step_asks_to_be_called_back_when_its_pause_ends(at_step_one: Rollout) -> None:
    """Steps of 1 min, analysis every 30 s: the next call is due at the sooner of the two."""
    sim = at_step_one.sim
    assert sim.last is not None and sim.last.requeue_after == 30.0
    decision = sim.tick(45, analysis=sample("Pass", sim.now + timedelta(seconds=45)))
    assert decision.requeue_after == 15.0, "the pause ends in 15 s, before the next analysis"
    decision = sim.tick(15)
    assert sim.status.canary is not None and sim.status.canary.step == 1
    assert decision.requeue_after == 30.0
