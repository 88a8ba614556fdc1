"""The gate's decision on its own (pure, no rollout pass): what a report observed for a ready canary before
step 1 means. The rollout acting on it is tested in tests/rollout/test_parity_gate.py."""

from __future__ import annotations

from datetime import timedelta

from folio.operator.parity import gate
from folio.operator.spec import (
    InferenceServiceSpec,
    InferenceServiceStatus,
    ParityPromptDiff,
    ParityReport,
    RevisionStatus,
    now_iso,
)
from tests.rollout.helpers import READY, T0, deployed, make_spec

GATE = {"prompts": 20, "maxTokens": 8, "minCosine": 0.999, "minTokenMatch": 0.9}


def waiting_canary() -> tuple[InferenceServiceSpec, InferenceServiceStatus, RevisionStatus]:
    """(spec, status, canary): a stable revision serving and a ready canary held before step 1."""
    sim = deployed(make_spec("a", parity=GATE))
    sim.apply(make_spec("b", parity=GATE))
    sim.tick(1)
    sim.facts[sim.rev] = READY
    sim.tick(1)
    canary = sim.status.revision(sim.status.canary_revision)
    assert canary is not None and sim.status.canary is not None and sim.status.canary.step_started_at is None
    return sim.spec, sim.status, canary


def report(status: InferenceServiceStatus, verdict: str, *, at: str | None = None, **kw) -> ParityReport:
    figures: dict = {"prompts": 20, "mean_cosine": 0.99999, "min_cosine": 0.9999, "token_match": 1.0}
    if verdict == "Fail":
        figures = {"prompts": 20, "mean_cosine": 0.93, "min_cosine": 0.41, "token_match": 0.35,
                   "worst": [ParityPromptDiff(index=3, prompt="2+2=", cosine=0.41, first_divergence=0,
                                              stable=" 4", canary=" banana")]}
    if verdict == "Error":
        figures = {}
    kw.setdefault("revision", status.canary_revision)
    kw.setdefault("stable_revision", status.stable_revision)
    return ParityReport(at=at, verdict=verdict, **figures, **kw)


NOW = T0 + timedelta(minutes=5)


def test_no_report_yet_waits_and_polls() -> None:
    spec, status, canary = waiting_canary()
    d = gate.decide(spec, status, canary, None, NOW)
    assert d == gate.GateDecision(gate.Wait(gate.POLL_S))


def test_a_passing_report_is_recorded_announced_and_lets_step_one_start() -> None:
    spec, status, canary = waiting_canary()
    d = gate.decide(spec, status, canary, report(status, "Pass", seconds=12.0), NOW)
    assert isinstance(d.action, gate.Proceed)
    assert d.record is not None and d.record.at == now_iso(NOW)  # stamped with the pass's time
    assert [(t, r) for t, r, _ in d.events] == [("Normal", "ParityPassed")]
    assert "in 12s" in d.events[0][2]


def test_a_failing_report_fails_the_canary_with_figures_and_the_diff() -> None:
    spec, status, canary = waiting_canary()
    d = gate.decide(spec, status, canary, report(status, "Fail"), NOW)
    action = d.action
    assert isinstance(action, gate.Fail) and action.reason == "ParityFailed"
    assert action.report.mean_cosine == 0.93 and d.record == action.report
    assert "mean cosine 0.930000" in action.message and f"against {status.stable_revision}" in action.message
    assert d.events == ()  # the rollback's own Event says it; the diff follows it
    [(kind, reason, message)] = action.events
    assert (kind, reason) == ("Warning", "ParityDiff") and "' banana'" in message


def test_a_gate_that_could_not_run_waits_and_is_announced_once() -> None:
    spec, status, canary = waiting_canary()
    error = report(status, "Error", at=now_iso(NOW), message="suite line 3: not JSON")
    d = gate.decide(spec, status, canary, error, NOW)
    assert d.action == gate.Wait(gate.RETRY_S) and d.record == error
    assert [r for _, r, _ in d.events] == ["ParityGateError"]
    assert status.canary is not None
    status.canary.parity = d.record
    later = NOW + timedelta(seconds=40)
    again = report(status, "Error", at=now_iso(later), message="suite line 3: not JSON")
    d = gate.decide(spec, status, canary, again, later)
    assert d.record == again and d.events == ()  # the same message: no second Event
    assert gate.degraded(status) is not None and gate.degraded(status)[0] == "ParityGateError"


def test_a_report_recorded_already_or_about_another_pair_does_not_count() -> None:
    spec, status, canary = waiting_canary()
    assert status.canary is not None
    status.canary.parity = report(status, "Error", at=now_iso(NOW), message="boom")
    older = report(status, "Pass", at=now_iso(NOW - timedelta(seconds=1)))
    assert gate.decide(spec, status, canary, older, NOW) == gate.GateDecision(gate.Wait(gate.RETRY_S))
    other_canary = report(status, "Pass", revision="notthecanary")
    assert gate.decide(spec, status, canary, other_canary, NOW).record is None
    other_stable = report(status, "Pass", stable_revision="someother")
    later = NOW + timedelta(seconds=1)
    d = gate.decide(spec, status, canary, other_stable, later)
    assert d.record == other_stable.model_copy(update={"at": now_iso(later)})
    assert isinstance(d.action, gate.Wait)  # recorded, but not about this canary against this stable


def test_promote_or_no_gate_proceeds_without_recording() -> None:
    spec, status, canary = waiting_canary()
    d = gate.decide(spec, status, canary, report(status, "Fail"), NOW, promote=True)
    assert d == gate.GateDecision(gate.Proceed())
    assert gate.decide(make_spec("b"), status, canary, report(status, "Fail"), NOW) == gate.GateDecision(gate.Proceed())


def test_shadow_is_held_until_step_one() -> None:
    _, status, _ = waiting_canary()
    assert gate.holds_shadow(status)
    assert status.canary is not None
    status.canary.step_started_at = status.canary.started_at
    assert not gate.holds_shadow(status)
    assert not gate.holds_shadow(InferenceServiceStatus())
