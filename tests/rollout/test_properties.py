"""Property tests: random sequences of cluster events, spec edits, samples and overrides.

After every call of ``advance`` the invariants of the rollout model must hold, and running the same
call on status that went through the wire (serialize → parse) must give the identical decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from folio.operator.rollout import Decision, Observed, RevisionFacts, advance
from folio.operator.spec import InferenceServiceStatus, now_iso, revision_name
from tests.rollout.helpers import Sim, make_spec, sample

TAGS = "abcd"
SPECS = {tag: make_spec(tag) for tag in TAGS}
FAST = {tag: make_spec(tag, steps=[{"weight": 20, "pause": "10s"}], drainPeriod="0s") for tag in TAGS}
REVS = {revision_name(s): tag for tag, s in SPECS.items()} | {revision_name(s): tag for tag, s in FAST.items()}


@dataclass(frozen=True)
class Wait:
    seconds: int


@dataclass(frozen=True)
class Cluster:
    """New facts for one revision; ``tag`` None means the revision the spec names now."""

    tag: str | None
    fast: bool
    facts: RevisionFacts


@dataclass(frozen=True)
class Apply:
    tag: str
    fast: bool


@dataclass(frozen=True)
class Analyse:
    verdict: str


@dataclass(frozen=True)
class Override:
    names: frozenset[str]


facts = st.builds(
    RevisionFacts,
    weights=st.sampled_from(["pending", "ready", "ready", "ready", "failed"]),
    ready_replicas=st.sampled_from([0, 1, 1, 2]),
    crash_looping=st.sampled_from([False, False, False, False, True]),
)
actions = st.one_of(
    st.builds(Wait, st.sampled_from([0, 5, 30, 61, 90])),
    st.builds(Cluster, st.none() | st.sampled_from(TAGS), st.booleans(), facts),
    st.builds(Cluster, st.none(), st.booleans(), st.just(RevisionFacts("ready", ready_replicas=1))),
    # the spec's revision loses its replicas (a canary mid-step, a stable restarting)
    st.builds(Cluster, st.none(), st.booleans(), st.just(RevisionFacts("ready", ready_replicas=0))),
    st.builds(Apply, st.sampled_from(TAGS), st.booleans()),
    st.builds(Analyse, st.sampled_from(["Pass", "Pass", "Fail", "Inconclusive"])),
    st.builds(Override, st.frozensets(st.sampled_from(["promote", "abort", "retry"]), min_size=1)),
)


def spec_for(tag: str, fast: bool):
    return (FAST if fast else SPECS)[tag]


def check_invariants(before: InferenceServiceStatus, observed: Observed, d: Decision) -> None:
    s = d.status
    weights = {t.revision: t.weight for t in s.traffic}
    assert len(weights) == len(s.traffic), "a revision is listed twice in traffic"
    if s.traffic:
        assert sum(weights.values()) == 100
        assert all(w > 0 for w in weights.values())
    names = [r.name for r in s.revisions]
    assert len(names) == len(set(names))
    roles = {r.name: r.role for r in s.revisions}
    if s.stable_revision is not None:
        assert roles.get(s.stable_revision) == "Stable"
    if s.canary_revision is not None:
        assert roles.get(s.canary_revision) == "Canary"
        assert s.canary is not None and s.canary_revision != s.stable_revision
    assert list(roles.values()).count("Stable") <= 1 and list(roles.values()).count("Canary") <= 1

    served_before = {t.revision for t in before.traffic}
    for name, weight in weights.items():
        assert name in (s.stable_revision, s.canary_revision), "traffic only to stable and canary"
        rev = s.revision(name)
        assert rev is not None
        seen = observed.revisions.get(name)
        weights_ok = seen.weights == "ready" if seen else rev.weights_ready
        assert weights_ok, f"traffic to {name} whose weights are not verified"
        if name == s.canary_revision:
            assert seen is None or (seen.ready_replicas > 0 and not seen.crash_looping)
            assert s.canary is not None and weight == s.canary.weight <= 99
        elif name not in served_before:
            assert seen is not None and seen.ready_replicas > 0, f"first traffic to unready {name}"
    if s.canary is not None and s.canary_revision not in weights:
        assert s.canary.weight == 0

    failed_now = {f.revision for f in s.failed_revisions}
    assert not failed_now & set(weights), "a failed revision still gets traffic"
    rolled_back = any(e.reason in ("RolledBack", "Aborted", "CrashLoopBackOff") for e in d.events)
    if rolled_back and s.traffic:
        assert weights == {s.stable_revision: 100}, "rollback leaves 100% stable"

    blocked = {f.revision for f in before.failed_revisions}
    if "retry" not in observed.overrides:
        for name in blocked:
            assert name not in weights and name not in (s.stable_revision, s.canary_revision), (
                f"failed revision {name} retried without a retry"
            )
            assert name in failed_now
    assert set(d.overrides_done) <= observed.overrides
    assert d.requeue_after is None or d.requeue_after >= 1.0


def same_after_the_wire(sim: Sim, observed: Observed, d: Decision) -> None:
    resumed = InferenceServiceStatus.model_validate(sim.status.to_wire())
    again = advance(sim.spec, sim.generation, resumed, observed)
    assert again.status.to_wire() == d.status.to_wire()
    assert again.events == d.events
    assert again.overrides_done == d.overrides_done
    assert again.requeue_after == d.requeue_after


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(actions, min_size=1, max_size=40))
def test_invariants_hold_over_random_histories(history: list) -> None:
    sim = Sim(SPECS["a"])
    cluster: dict[str, RevisionFacts] = {}
    for action in history:
        overrides: frozenset[str] = frozenset()
        analysis = None
        if isinstance(action, Wait):
            sim.now += timedelta(seconds=action.seconds)
        elif isinstance(action, Cluster):
            name = sim.rev if action.tag is None else revision_name(spec_for(action.tag, action.fast))
            cluster[name] = action.facts
        elif isinstance(action, Apply):
            sim.apply(spec_for(action.tag, action.fast))
        elif isinstance(action, Analyse):
            sim.now += timedelta(seconds=1)
            analysis = sample(action.verdict, sim.now)
        else:
            overrides = action.names
        observed = Observed(now=sim.now, revisions=dict(cluster), analysis=analysis, overrides=overrides)
        before = sim.status
        d = advance(sim.spec, sim.generation, before, observed)
        check_invariants(before, observed, d)
        same_after_the_wire(sim, observed, d)
        # status written back to the API server and read again, as kopf would
        sim.status = InferenceServiceStatus.model_validate(d.status.to_wire())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(["Pass", "Fail", "Inconclusive"]), min_size=1, max_size=12),
    st.integers(1, 3),
)
def test_rollback_comes_exactly_after_failure_limit_consecutive_failures(verdicts: list[str], limit: int) -> None:
    spec = make_spec("b", analysis={"interval": "30s", "minRequests": 10, "failureLimit": limit})
    spec.rollout.steps[0].pause = "1h"  # stay on step one: only analysis decides
    sim = Sim(make_spec("a"))
    sim.facts[sim.rev] = RevisionFacts("ready", ready_replicas=1)
    sim.tick()
    sim.apply(spec)
    sim.facts[sim.rev] = RevisionFacts("ready", ready_replicas=1)
    sim.tick(1)
    run = 0
    for verdict in verdicts:
        sim.tick(30, analysis=sample(verdict, sim.now + timedelta(seconds=30)))
        run = run + 1 if verdict == "Fail" else 0 if verdict == "Pass" else run
        if run >= limit:
            assert sim.status.phase == "RolledBack"
            assert now_iso(sim.now) == sim.status.failed_revisions[-1].at
            return
        assert sim.status.canary_revision == sim.rev
