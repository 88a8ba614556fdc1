"""The RolloutPolicy state machine (`folio.operator.fleet.policy`): examples, then property tests over
random fleets played step by step (canaries start only through the gate, promote or roll back at random,
time passes, someone resumes now and then).

Invariants after every pass: never more than ``maxConcurrent`` canaries admitted or running; no admission
once the rollbacks since the last resume reach ``failureBudget``; a wave admits only once every earlier
wave is done, soaked, and without a counted rollback; the same pass on status that went through the wire
gives the same answer (the state is in statuses, not memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from folio.operator.fleet.gate import PolicyRef, hold
from folio.operator.fleet.model import WAVE_LABEL, LabelSelector, RolloutPolicySpec, RolloutPolicyStatus
from folio.operator.fleet.policy import Failure, PolicyDecision, ServiceView, decide, wave_index
from folio.operator.spec import now_iso, parse_time

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
PROD = {"tier": "prod"}


def spec(**kw: object) -> RolloutPolicySpec:
    return RolloutPolicySpec.model_validate({"selector": {"matchLabels": PROD}, **kw})


def view(name: str, wave: str | None = None, **kw: object) -> ServiceView:
    labels = {**PROD, **({WAVE_LABEL: wave} if wave is not None else {})}
    base: dict[str, object] = {"target": "r2", "stable": "r1", "policies": frozenset({"fleet"})}
    return ServiceView(name, labels, **{**base, **kw})  # type: ignore[arg-type]


def phases(d: PolicyDecision) -> dict[str, str]:
    return {s.name: s.phase for s in d.status.services}


def test_admits_up_to_max_concurrent_in_wave_order() -> None:
    s = spec(maxConcurrent=2, waves=[{"label": "0", "soak": "1m"}, {"label": "1"}])
    fleet = [view("a", "1"), view("b", "0"), view("c", "0"), view("d", "0"), view("e")]
    d = decide("fleet", s, 1, RolloutPolicyStatus(), fleet, T0)
    assert phases(d) == {"a": "Pending", "b": "Admitted", "c": "Admitted", "d": "Pending", "e": "Pending"}
    assert (d.status.phase, d.status.wave, d.status.running) == ("Progressing", "0", ["b", "c"])
    # b's canary starts, c promotes: d may start
    fleet = [view("a", "1"), view("b", "0", canary="r2"), view("c", "0", stable="r2"), view("d", "0"), view("e")]
    d = decide("fleet", s, 1, d.status, fleet, T0 + timedelta(seconds=5))
    assert phases(d) == {"a": "Pending", "b": "Running", "c": "Promoted", "d": "Admitted", "e": "Pending"}
    # the whole wave promoted: it soaks a minute from the last promotion before wave 1
    now = T0 + timedelta(seconds=10)
    fleet = [view("a", "1"), *(view(n, "0", stable="r2") for n in "bcd"), view("e")]
    d = decide("fleet", s, 1, d.status, fleet, now)
    assert (d.status.phase, d.status.wave, d.status.running) == ("Soaking", "0", [])
    assert d.requeue_after is not None and 50 <= d.requeue_after <= 60
    d = decide("fleet", s, 1, d.status, fleet, now + timedelta(seconds=61))
    assert phases(d)["a"] == "Admitted" and phases(d)["e"] == "Pending"


def test_the_budget_halts_and_resume_goes_on() -> None:
    s = spec(maxConcurrent=3, failureBudget=1)
    d = decide("fleet", s, 1, RolloutPolicyStatus(), [view(n) for n in "abcde"], T0)
    assert d.status.running == ["a", "b", "c"]
    later = T0 + timedelta(seconds=30)
    fleet = [view("a", failed=(Failure("r2", "AnalysisFailed", now_iso(later), "error rate 50%"),)),
             view("b", canary="r2"), view("c"), view("d"), view("e")]
    d = decide("fleet", s, 1, d.status, fleet, later)
    assert d.status.phase == "Halted"
    assert phases(d) == {"a": "RolledBack", "b": "Running", "c": "Pending", "d": "Pending", "e": "Pending"}
    halted = d.status.condition("Halted")
    assert halted is not None and halted.status == "True" and "a (revision r2: AnalysisFailed" in halted.message
    assert [e.reason for e in d.events].count("Halted") == 1
    assert d.status.rolled_back[0].name == "a"
    # a resume resets the budget: the rollback before it no longer counts
    d = decide("fleet", s, 1, d.status, fleet, later + timedelta(seconds=1), resume="x")
    assert d.status.phase == "Progressing" and phases(d)["c"] == "Admitted"
    assert d.status.condition("Halted").status == "False"  # type: ignore[union-attr]
    # the same annotation value again is not a new resume
    d2 = decide("fleet", s, 1, d.status, fleet, later + timedelta(seconds=2), resume="x")
    assert d2.status.resumed_at == d.status.resumed_at


def test_two_policies_selecting_one_service_is_an_error_and_it_waits() -> None:
    s = spec()
    d = decide("fleet", s, 1, RolloutPolicyStatus(), [view("a", policies=frozenset({"fleet", "other"})), view("b")],
               T0)
    assert phases(d) == {"a": "Conflict", "b": "Admitted"}
    ready = d.status.condition("Ready")
    assert ready is not None and (ready.status, ready.reason) == ("False", "SelectedTwice")
    assert "fleet, other" in ready.message
    refs = [PolicyRef("fleet", s.selector, d.status), PolicyRef("other", LabelSelector(), RolloutPolicyStatus())]
    held = hold(refs, "a", view("a").labels, "r2")
    assert held is not None and "fleet, other" in held.message


def test_the_gate_releases_at_once() -> None:
    s = spec()
    d = decide("fleet", s, 1, RolloutPolicyStatus(), [view("a"), view("b")], T0)
    ref = PolicyRef("fleet", s.selector, d.status)
    assert hold([ref], "a", view("a").labels, "r2") is None  # admitted
    held = hold([ref], "b", view("b").labels, "r2")
    assert held is not None and held.policy == "fleet" and "RolloutPolicy fleet" in held.message
    assert hold([ref], "a", view("a").labels, "r3") is not None  # admitted for r2, not for a newer one
    assert hold([ref], "b", {"tier": "dev"}, "r2") is None  # left the selector
    assert hold([], "b", view("b").labels, "r2") is None  # the policy is gone


def test_first_revisions_and_unselected_services_are_not_governed() -> None:
    d = decide("fleet", spec(), 1, RolloutPolicyStatus(),
               [view("new", stable=None), ServiceView("dev", {"tier": "dev"}, "r2", "r1")], T0)
    assert phases(d) == {"new": "Idle"} and d.status.phase == "Idle"


# --------------------------------------------------------------------------- property tests


@dataclass
class Svc:
    name: str
    wave: str | None
    stable: str = "r1"
    target: str = "r2"
    canary: str | None = None
    failed: list[Failure] = field(default_factory=list)

    def view(self) -> ServiceView:
        labels = {**PROD, **({WAVE_LABEL: self.wave} if self.wave is not None else {})}
        return ServiceView(self.name, labels, self.target, self.stable, self.canary, tuple(self.failed),
                           frozenset({"fleet"}))


WAVE_LABELS = ["0", "1", "2"]
fleets = st.lists(st.sampled_from([*WAVE_LABELS, None, "9"]), min_size=1, max_size=12)
actions = st.lists(st.tuples(st.sampled_from(["start", "promote", "fail", "wait", "resume", "bump"]),
                             st.integers(0, 11), st.integers(1, 120)), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(waves=fleets, steps=actions, max_concurrent=st.integers(1, 4), budget=st.integers(1, 3),
       n_waves=st.integers(0, 3), soak=st.sampled_from(["0s", "30s", "2m"]))
def test_random_fleets(waves: list[str | None], steps: list[tuple[str, int, int]], max_concurrent: int,
                       budget: int, n_waves: int, soak: str) -> None:
    s = spec(maxConcurrent=max_concurrent, failureBudget=budget,
             waves=[{"label": w, "soak": soak} for w in WAVE_LABELS[:n_waves]])
    fleet = [Svc(f"s{i:02d}", w) for i, w in enumerate(waves)]
    status, now, resumes = RolloutPolicyStatus(), T0, 0
    for action, index, seconds in steps:
        ref = PolicyRef("fleet", s.selector, status)
        running = [x for x in fleet if x.canary is not None]
        startable = [x for x in fleet if x.canary is None and x.target != x.stable and not _failed(x)
                     and hold([ref], x.name, x.view().labels, x.target) is None]  # only through the gate
        if action == "wait":
            now += timedelta(seconds=seconds)
        elif action == "resume":
            resumes += 1
        elif action == "start" and startable:
            svc = startable[index % len(startable)]
            svc.canary = svc.target
        elif action == "promote" and running:
            svc = running[index % len(running)]
            svc.stable, svc.canary = svc.canary, None
        elif action == "fail" and running:
            svc = running[index % len(running)]
            svc.failed.append(Failure(svc.canary, "AnalysisFailed", now_iso(now), "figures"))
            svc.canary = None
        elif action == "bump":  # a new commit: a new revision for this one
            svc = fleet[index % len(fleet)]
            if svc.canary is None:
                svc.target = f"r{int(svc.target[1:]) + 1}"
        now += timedelta(seconds=1)
        before = status
        d = decide("fleet", s, 1, status, [x.view() for x in fleet], now, resume=f"r{resumes}" if resumes else None)
        check(s, before, d, fleet, now)
        again = decide("fleet", s, 1, RolloutPolicyStatus.model_validate(before.to_wire()),
                       [x.view() for x in fleet], now, resume=f"r{resumes}" if resumes else None)
        assert again.status == d.status, "a pass depends on its inputs alone (status through the wire)"
        status = d.status


def _failed(svc: Svc) -> bool:
    return any(f.revision == svc.target for f in svc.failed)


def check(s: RolloutPolicySpec, before: RolloutPolicyStatus, d: PolicyDecision, fleet: list[Svc],
          now: datetime) -> None:
    rows = {r.name: r for r in d.status.services}
    in_flight = [n for n, r in rows.items() if r.phase in ("Admitted", "Running")]
    assert len(in_flight) <= s.max_concurrent, (in_flight, s.max_concurrent)
    assert sorted(d.status.running) == sorted(in_flight)
    newly = [n for n, r in rows.items() if r.phase == "Admitted" and
             (before.service(n) is None or before.service(n).phase != "Admitted"  # type: ignore[union-attr]
              or before.service(n).revision != r.revision)]  # type: ignore[union-attr]
    resumed_at = parse_time(d.status.resumed_at or now_iso(now))
    counted = [x for x in fleet if _failed(x) and x.canary is None and any(
        f.revision == x.target and parse_time(f.at or "") >= resumed_at for f in x.failed)]
    if len(counted) >= s.failure_budget:
        assert not newly, "a canary admitted after the failure budget was spent"
        assert d.status.phase == "Halted" and not [n for n, r in rows.items() if r.phase == "Admitted"]
    by_name = {x.name: x for x in fleet}
    for name in newly:
        w = wave_index(s, by_name[name].view().labels)
        for other in fleet:
            ow = wave_index(s, other.view().labels)
            if ow < w:
                assert rows[other.name].phase in ("Idle", "Promoted", "RolledBack"), (name, other.name, rows)
                assert other not in counted, "a wave started after a wave with a rollback"
                if rows[other.name].phase == "Promoted" and ow < len(s.waves):
                    soaked = parse_time(rows[other.name].since or "") + timedelta(seconds=s.waves[ow].soak_seconds)
                    assert soaked <= now, "a wave started before the one before it soaked"


@settings(max_examples=60, deadline=None)
@given(waves=fleets, max_concurrent=st.integers(1, 4), n_waves=st.integers(0, 3))
def test_a_fleet_without_failures_is_promoted_entirely(waves: list[str | None], max_concurrent: int,
                                                       n_waves: int) -> None:
    s = spec(maxConcurrent=max_concurrent, waves=[{"label": w, "soak": "1m"} for w in WAVE_LABELS[:n_waves]])
    fleet = [Svc(f"s{i:02d}", w) for i, w in enumerate(waves)]
    status, now = RolloutPolicyStatus(), T0
    for _ in range(4 * len(fleet) + 10):
        d = decide("fleet", s, 1, status, [x.view() for x in fleet], now)
        for x in fleet:
            if x.canary is not None:
                x.stable, x.canary = x.canary, None
            elif d.status.service(x.name) is not None and d.status.service(x.name).phase == "Admitted":  # type: ignore[union-attr]
                x.canary = x.target
        status, now = d.status, now + timedelta(seconds=d.requeue_after or 1)
    assert all(x.stable == "r2" for x in fleet)
    assert replace(d).status.phase in ("Idle", "Soaking")
