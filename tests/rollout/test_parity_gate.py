"""The parity gate before step 1: no traffic until a passing report; a failing one rolls back (ParityFailed);
one that could not run keeps the canary waiting with Degraded=True, and is tried again."""

from __future__ import annotations

from folio.operator.parity import gate as parity_gate
from folio.operator.serving.router import RoutedSpec, router_config
from folio.operator.spec import ParityPromptDiff, ParityReport, now_iso
from tests.rollout.helpers import READY, Sim, deployed, make_spec

GATE = {"prompts": 20, "maxTokens": 8, "minCosine": 0.999, "minTokenMatch": 0.9}


def gated(tag: str = "b") -> tuple[Sim, str, str]:
    """A stable revision serving, and a ready canary whose spec asks for the gate."""
    sim = deployed(make_spec("a", parity=GATE))
    stable = sim.rev
    sim.apply(make_spec(tag, parity=GATE))
    sim.tick(1)
    sim.facts[sim.rev] = READY
    sim.tick(1)
    return sim, stable, sim.rev


def report(sim: Sim, canary: str, stable: str, verdict: str, **kw) -> ParityReport:
    figures = {"prompts": 20, "mean_cosine": 0.99999, "min_cosine": 0.9999, "token_match": 1.0}
    if verdict == "Fail":
        figures = {"prompts": 20, "mean_cosine": 0.93, "min_cosine": 0.41, "token_match": 0.35}
        kw.setdefault("worst", [ParityPromptDiff(index=3, prompt="2+2=", cosine=0.41, first_divergence=0,
                                                 stable=" 4", canary=" banana")])
    if verdict == "Error":
        figures = {}
    return ParityReport(revision=canary, stable_revision=stable, at=now_iso(sim.now), verdict=verdict,
                        **figures, **kw)


def test_no_traffic_until_the_gate_passes() -> None:
    sim, stable, canary = gated()
    assert sim.weights() == {stable: 100}
    assert parity_gate.due(sim.spec, sim.status, sim.now) == (canary, stable)
    assert sim.condition("Progressing") == ("True", "ParityGate")
    assert sim.last is not None and sim.last.requeue_after == parity_gate.POLL_S
    sim.tick(120)  # pauses pass, no report yet: still nothing
    assert sim.weights() == {stable: 100}
    sim.tick(1, parity=report(sim, canary, stable, "Pass"))
    assert sim.weights() == {stable: 90, canary: 10}
    assert sim.status.canary is not None and sim.status.canary.parity is not None
    assert sim.status.canary.parity.verdict == "Pass"
    assert parity_gate.due(sim.spec, sim.status, sim.now) is None
    assert "ParityPassed" in sim.reasons()


def test_a_failing_gate_rolls_back_with_the_figures_and_the_diff() -> None:
    sim, stable, canary = gated()
    sim.tick(1, parity=report(sim, canary, stable, "Fail"))
    assert sim.weights() == {stable: 100}
    failed = sim.status.failed_revisions[-1]
    assert failed.revision == canary and failed.reason == "ParityFailed"
    assert failed.parity is not None and failed.parity.mean_cosine == 0.93
    assert sim.condition("Degraded") == ("True", "ParityFailed")
    degraded = sim.status.condition("Degraded")
    assert degraded is not None and "mean cosine 0.930000" in degraded.message and "token match 35.0%" in degraded.message
    diff = next(e for e in sim.events if e.reason == "ParityDiff")
    assert diff.type == "Warning" and "' banana'" in diff.message and "diverge at token 0" in diff.message
    assert sim.status.phase == "RolledBack"
    sim.tick(60)
    assert sim.status.canary_revision is None and sim.weights() == {stable: 100}


def test_a_gate_that_cannot_run_is_degraded_and_retried() -> None:
    sim, stable, canary = gated()
    sim.tick(1, parity=report(sim, canary, stable, "Error", message="suite line 3: not JSON"))
    assert sim.weights() == {stable: 100}
    assert sim.condition("Degraded") == ("True", "ParityGateError")
    assert sim.condition("Ready")[0] == "True"  # stable keeps serving
    assert not sim.status.failed_revisions
    assert parity_gate.due(sim.spec, sim.status, sim.now) is None
    sim.tick(parity_gate.RETRY_S)
    assert parity_gate.due(sim.spec, sim.status, sim.now) == (canary, stable)
    sim.tick(1, parity=report(sim, canary, stable, "Pass"))
    assert sim.weights() == {stable: 90, canary: 10}
    assert sim.condition("Degraded") == ("False", "AsExpected")


def test_a_report_against_another_stable_or_canary_does_not_count() -> None:
    sim, stable, canary = gated()
    sim.tick(1, parity=report(sim, canary, "someother", "Pass"))
    assert sim.weights() == {stable: 100}
    sim.tick(1, parity=report(sim, "notthecanary", stable, "Pass"))
    assert sim.weights() == {stable: 100}


def test_the_gate_waits_for_ready_replicas_on_both_sides() -> None:
    sim = deployed(make_spec("a", parity=GATE))
    sim.apply(make_spec("b", parity=GATE))
    sim.tick(1)
    assert parity_gate.due(sim.spec, sim.status, sim.now) is None  # canary weights not verified yet


def test_promote_skips_the_gate() -> None:
    sim, _, canary = gated()
    sim.tick(1, overrides=frozenset({"promote"}))
    assert sim.status.stable_revision == canary


def test_without_the_gate_step_one_starts_at_once() -> None:
    sim = deployed()
    sim.apply(make_spec("b"))
    sim.tick(1)
    sim.facts[sim.rev] = READY
    sim.tick(1)
    assert sim.weights()[sim.rev] == 10
    assert parity_gate.due(sim.spec, sim.status, sim.now) is None


def test_no_shadow_copies_before_the_gate_passes() -> None:
    sim, stable, canary = gated()
    spec = RoutedSpec.of(type(sim.spec).model_validate({**sim.spec.to_wire(), "shadow": {"percent": 50.0}}))
    assert router_config(spec, sim.status, {stable: ["http://a"], canary: ["http://b"]}).shadow is None
    sim.tick(1, parity=report(sim, canary, stable, "Pass"))
    cfg = router_config(spec, sim.status, {stable: ["http://a"], canary: ["http://b"]})
    assert cfg.shadow is not None and cfg.shadow.percent == 50.0
