"""Phase and conditions: directed tests for `rollout/conditions.py`."""

from __future__ import annotations

from datetime import timedelta

from folio.operator.rollout.conditions import CONDITION_ORDER, invalid_spec, set_condition
from tests.rollout.conftest import Rollout
from tests.rollout.helpers import T0, deployed


def test_an_invalid_spec_degrades_and_stops_progress_leaving_the_rest() -> None:
    sim = deployed()
    before = sim.status
    after = invalid_spec(before, "InvalidEngineArgs", "unknown engine arg 'x'", generation=7, now=T0 + timedelta(1))
    assert after.condition("Degraded").model_dump() == {
        "type": "Degraded", "status": "True", "reason": "InvalidEngineArgs", "message": "unknown engine arg 'x'",
        "last_transition_time": "2026-03-02T12:00:00Z", "observed_generation": 7,
    }
    progressing = after.condition("Progressing")
    assert (progressing.status, progressing.reason) == ("False", "InvalidEngineArgs")
    assert after.observed_generation == 7
    assert after.condition("Ready") == before.condition("Ready"), "what runs keeps running, and says so"
    assert (after.traffic, after.revisions) == (before.traffic, before.revisions)


def test_conditions_keep_their_order_and_move_only_on_a_flip() -> None:
    conditions = set_condition([], "WeightsReady", "False", "Pulling", "m", generation=1, now=T0)
    conditions = set_condition(conditions, "Ready", "False", "NoRevision", "m", generation=1, now=T0)
    later = T0 + timedelta(minutes=1)
    conditions = set_condition(conditions, "WeightsReady", "False", "Pulling", "50%", generation=2, now=later)
    assert [c.type for c in conditions] == ["Ready", "WeightsReady"]
    assert conditions[1].last_transition_time == "2026-03-01T12:00:00Z" and conditions[1].message == "50%"
    conditions = set_condition(conditions, "WeightsReady", "True", "Verified", "ok", generation=2, now=later)
    assert conditions[1].last_transition_time == "2026-03-01T12:01:00Z"


def test_a_pass_lists_all_four_in_order(at_step_one: Rollout) -> None:
    sim = at_step_one.sim
    assert tuple(c.type for c in sim.status.conditions) == CONDITION_ORDER
    assert sim.status.phase == "Canary"
    assert sim.condition("Progressing") == ("True", "CanaryStep")


def test_promoted_stays_the_phase_until_something_else_happens(at_step_one: Rollout) -> None:
    sim = at_step_one.sim
    sim.tick(1, overrides=frozenset({"promote"}))
    for _ in range(3):
        sim.tick(60)
        assert sim.status.phase == "Promoted"
