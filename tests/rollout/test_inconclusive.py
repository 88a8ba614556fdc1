"""A step that stays Inconclusive: ``maxInconclusiveDuration`` and the three ``onInconclusive`` actions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from folio.operator.rollout.inconclusive import TOO_LONG
from folio.operator.rollout.types import nothing_to_act_on
from folio.operator.spec import InferenceServiceSpec, parse_time
from tests.rollout.helpers import READY, Sim, deployed, make_spec, sample

INTERVAL_S = 30


def spec(tag: str, action: str, limit: str = "2m", pause: str = "1m") -> InferenceServiceSpec:
    return make_spec(tag, steps=[{"weight": 10, "pause": pause}, {"weight": 50, "pause": pause}],
                     analysis={"interval": f"{INTERVAL_S}s", "minRequests": 10, "failureLimit": 2,
                               "maxInconclusiveDuration": limit, "onInconclusive": action})


def canary(action: str, limit: str = "2m", pause: str = "1m") -> Sim:
    """A canary at step 1 (10%) since ``sim.now``."""
    sim = deployed(spec("a", action, limit, pause))
    sim.apply(spec("b", action, limit, pause))
    sim.facts[sim.rev] = READY
    sim.tick()
    assert sim.status.canary is not None and sim.status.canary.weight == 10
    return sim


def quiet(sim: Sim, intervals: int, requests: int = 3) -> None:
    """``intervals`` Inconclusive samples, one per interval."""
    for _ in range(intervals):
        sim.tick(INTERVAL_S, analysis=sample("Inconclusive", sim.now + timedelta(seconds=INTERVAL_S),
                                             requests=requests))


def test_defaults() -> None:
    a = make_spec("a").rollout.analysis
    assert (a.max_inconclusive_duration, a.max_inconclusive_seconds, a.on_inconclusive) == ("30m", 1800.0, "Pause")


@pytest.mark.parametrize("bad", [{"maxInconclusiveDuration": "0s"}, {"maxInconclusiveDuration": "soon"},
                                 {"onInconclusive": "Wait"}])
def test_invalid_settings_are_refused(bad: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        make_spec("a", analysis=bad)


def test_pause_holds_the_step_until_someone_acts() -> None:
    sim = canary("Pause")
    stable, new = sim.status.stable_revision, sim.rev
    quiet(sim, 3)  # 90 s without a verdict: not yet
    assert sim.status.phase == "Canary" and TOO_LONG not in sim.reasons()
    quiet(sim, 1)  # 120 s
    assert sim.status.phase == "Paused" and sim.reasons().count(TOO_LONG) == 1
    assert sim.condition("Progressing") == ("False", TOO_LONG)
    message = sim.status.condition("Progressing").message  # type: ignore[union-attr]
    assert "120 s" in message and "minRequests 10" in message and "3 canary requests" in message
    assert sim.condition("Ready") == ("True", "Serving") and sim.condition("Degraded")[0] == "False"
    # a late pass does not end the pause: it stays on this traffic until someone acts
    sim.tick(INTERVAL_S, analysis=sample("Pass", sim.now + timedelta(seconds=INTERVAL_S)))
    sim.tick(120)
    assert sim.weights() == {stable: 90, new: 10} and sim.status.phase == "Paused"
    assert sim.reasons().count(TOO_LONG) == 1 and sim.last is not None and sim.last.requeue_after == INTERVAL_S
    # the status the CLI reads says retry has something to act on
    assert nothing_to_act_on("retry", sim.status, new) is None
    sim.tick(1, overrides=frozenset({"promote"}))
    assert sim.weights() == {new: 100} and sim.status.phase == "Promoted"


def test_retry_analyses_a_paused_step_afresh() -> None:
    sim = canary("Pause")
    quiet(sim, 4)
    assert sim.status.phase == "Paused"
    d = sim.tick(1, overrides=frozenset({"retry"}))
    assert d.overrides_done == frozenset({"retry"}) and "Resumed" in sim.reasons()
    c = sim.status.canary
    assert c is not None and c.paused is None and c.step == 0
    assert parse_time(c.step_started_at or "") == sim.now.replace(microsecond=0)
    quiet(sim, 3)  # the clock starts again with the step
    assert sim.status.phase == "Canary"
    sim.tick(INTERVAL_S, analysis=sample("Pass", sim.now + timedelta(seconds=INTERVAL_S)))
    assert sim.status.canary is not None and sim.status.canary.weight == 50  # evidence, pause over: next step


def test_abort_and_failing_samples_still_roll_a_paused_canary_back() -> None:
    sim = canary("Pause")
    quiet(sim, 4)
    for _ in range(2):
        sim.tick(INTERVAL_S, analysis=sample("Fail", sim.now + timedelta(seconds=INTERVAL_S), errors=50))
    assert sim.status.failed_revisions[-1].reason == "AnalysisFailed"
    sim = canary("Pause")
    quiet(sim, 4)
    sim.tick(1, overrides=frozenset({"abort"}))
    assert sim.status.failed_revisions[-1].reason == "Aborted"


def test_rollback() -> None:
    sim = canary("Rollback")
    stable = sim.status.stable_revision
    quiet(sim, 4)
    [failed] = sim.status.failed_revisions
    assert failed.revision == sim.rev and failed.reason == TOO_LONG
    assert "onInconclusive Rollback" in failed.message and "minRequests 10" in failed.message
    assert failed.last_analysis is not None and failed.last_analysis.accumulated is None
    assert sim.weights() == {stable: 100} and sim.condition("Degraded") == ("True", TOO_LONG)
    assert "RolledBack" in sim.reasons()


def test_promote_ends_each_step_for_lack_of_evidence() -> None:
    sim = canary("Promote")
    quiet(sim, 4)
    assert TOO_LONG in sim.reasons()
    c = sim.status.canary
    assert c is not None and c.step == 1 and c.steps_without_evidence == [0]
    quiet(sim, 3)  # the next step has a clock of its own
    assert sim.status.canary is not None and sim.status.canary.step == 1
    quiet(sim, 1)
    assert sim.weights() == {sim.rev: 100}
    promoted = [e.message for e in sim.events if e.reason == "Promoted"]
    assert promoted and "step(s) 1, 2 for lack of evidence" in promoted[-1]


def test_promote_waits_for_the_step_pause_too() -> None:
    sim = canary("Promote", limit="30s", pause="5m")
    quiet(sim, 2)
    assert sim.status.canary is not None and sim.status.canary.step == 0  # too long, but the pause is not over
    sim.tick(300)
    assert sim.status.canary is not None and sim.status.canary.step == 1


def test_a_conclusive_sample_restarts_the_clock() -> None:
    sim = canary("Rollback")
    quiet(sim, 3)
    sim.tick(INTERVAL_S, analysis=sample("Fail", sim.now + timedelta(seconds=INTERVAL_S), errors=50))
    quiet(sim, 3)
    assert not sim.status.failed_revisions
    quiet(sim, 1)
    assert sim.status.failed_revisions[-1].reason == TOO_LONG


@settings(max_examples=60, deadline=None)
@given(action=st.sampled_from(["Pause", "Rollback", "Promote"]), limit_s=st.integers(10, 600),
       gaps=st.lists(st.integers(1, 90), min_size=1, max_size=25))
def test_acts_exactly_once_the_step_has_been_inconclusive_that_long(action: str, limit_s: int,
                                                                     gaps: list[int]) -> None:
    """Samples at random gaps, all Inconclusive: nothing happens before ``maxInconclusiveDuration`` has passed
    since the step's first window began, and the action comes on the first pass after."""
    sim = canary(action, limit=f"{limit_s}s", pause="1s")
    c = sim.status.canary
    assert c is not None and c.step_started_at is not None
    start, since = parse_time(c.step_started_at), None
    for gap in gaps:
        at = sim.now + timedelta(seconds=gap)
        sim.tick(gap, analysis=sample("Inconclusive", at, requests=1))
        since = since or max(at - timedelta(seconds=INTERVAL_S), start)
        due = (sim.now - since).total_seconds() >= limit_s
        acted = TOO_LONG in sim.reasons() or "RolledBack" in sim.reasons()
        assert acted == due, (sim.now - since, limit_s)
        if due:
            break
    else:
        return
    if action == "Pause":
        assert sim.status.phase == "Paused" and sim.weights()[sim.rev] == 10
    elif action == "Rollback":
        assert sim.status.failed_revisions[-1].reason == TOO_LONG and sim.rev not in sim.weights()
    else:
        assert sim.status.canary is not None and sim.status.canary.step == 1
