"""The autoscaler's decisions as pure functions: bounds, delays, never down while replicas start."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from folio.operator.autoscaling.decide import Load, decide, initial_replicas, recommend
from folio.operator.spec import AutoscalingSpec, AutoscalingStatus

T0 = datetime(2026, 12, 3, tzinfo=timezone.utc)


def spec(**kw: object) -> AutoscalingSpec:
    return AutoscalingSpec.model_validate({"minReplicas": 1, "maxReplicas": 8, "target": 4, "scaleDownDelay": "60s",
                                           **kw})


def at(seconds: float, value: float | None, **kw: object) -> Load:
    return Load(now=T0 + timedelta(seconds=seconds), value=value, **kw)  # type: ignore[arg-type]


def test_up_at_once_down_after_the_delay_to_the_most_asked_in_it() -> None:
    s = spec()
    d = decide(s, None, at(0, 0, ready=1))
    assert d.status.desired_replicas == 1 and d.event is None
    d = decide(s, d.status, at(5, 11, ready=1, active=True))
    assert d.status.desired_replicas == 3 and d.event is not None and d.event.reason == "ScaledUp"
    assert d.status.last_scale_time == "2026-12-03T00:00:05Z" and "InFlight 11" in d.status.reason
    d = decide(s, d.status, at(10, 6, ready=3, active=True))  # asks for 2: not yet
    assert d.status.desired_replicas == 3 and d.requeue_after == pytest.approx(60)
    d = decide(s, d.status, at(40, 1, ready=3, active=True))  # asks for 1; the window keeps its most (2)
    assert d.status.desired_replicas == 3 and d.requeue_after == pytest.approx(30)
    d = decide(s, d.status, at(70, 1, ready=3, active=True))
    assert d.status.desired_replicas == 2 and d.event is not None and d.event.reason == "ScaledDown"
    assert d.status.lower_since is None


def test_a_dip_back_up_restarts_the_window() -> None:
    s = spec()
    d = decide(s, None, at(0, 12, ready=1, active=True))
    assert d.status.desired_replicas == 3
    d = decide(s, d.status, at(10, 0, ready=3))
    d = decide(s, d.status, at(50, 12, ready=3, active=True))  # demand is back: no window any more
    assert d.status.lower_since is None
    d = decide(s, d.status, at(80, 0, ready=3))
    d = decide(s, d.status, at(120, 0, ready=3))  # 40 s into the new window
    assert d.status.desired_replicas == 3


def test_scale_to_zero_only_without_requests_and_held_requests_bring_one_back() -> None:
    s = spec(minReplicas=0)
    d = decide(s, None, at(0, 0, ready=1))
    assert d.status.desired_replicas == 1  # a new service starts with one replica
    d = decide(s, d.status, at(30, 0, ready=1, active=True))  # a request came: no window
    d = decide(s, d.status, at(31, 0, ready=1))
    d = decide(s, d.status, at(95, 0, ready=1))
    assert d.status.desired_replicas == 0 and d.event is not None and d.event.reason == "ScaledToZero"
    assert "no requests for 60s" in d.status.reason
    d = decide(s, d.status, at(100, None, ready=0, held=1))  # router unreadable, but a scale up was asked
    assert d.status.desired_replicas == 1 and d.event is not None and d.event.reason == "ScaledUp"


def test_never_down_while_replicas_start() -> None:
    s = spec()
    d = decide(s, None, at(0, 20, ready=1, active=True))
    assert d.status.desired_replicas == 5
    d = decide(s, d.status, at(10, 0, ready=2, starting=3))
    d = decide(s, d.status, at(200, 0, ready=2, starting=3))
    assert d.status.desired_replicas == 5 and "start" in d.status.reason
    d = decide(s, d.status, at(201, 0, ready=5))  # up now: the window starts
    assert d.status.desired_replicas == 5
    d = decide(s, d.status, at(262, 0, ready=5))
    assert d.status.desired_replicas == 1


def test_metrics() -> None:
    assert recommend(spec(metric="Waiting", target=2), at(0, 7, ready=2)) == 4
    assert recommend(spec(metric="KVCache", target=0.5), at(0, 0.9, ready=3)) == 6  # 3 * 0.9 / 0.5 = 5.4
    assert recommend(spec(metric="KVCache", target=0.5), at(0, 0.0, ready=0, held=2)) == 1
    assert recommend(spec(), at(0, 8, ready=2)) == 2
    assert recommend(spec(), at(0, 100, ready=2)) == 8  # maxReplicas
    assert recommend(spec(), at(0, None)) is None
    assert initial_replicas(spec(minReplicas=0)) == 1 and initial_replicas(spec(minReplicas=3)) == 3


def test_bounds_changed_in_the_spec_apply_at_once() -> None:
    d = decide(spec(), None, at(0, 40, ready=1, active=True))
    assert d.status.desired_replicas == 8
    d = decide(spec(maxReplicas=4), d.status, at(1, 40, ready=8, active=True))
    assert d.status.desired_replicas == 4


def test_spec_refuses_inconsistent_bounds() -> None:
    with pytest.raises(ValueError, match="exceeds maxReplicas"):
        spec(minReplicas=5, maxReplicas=2)
    with pytest.raises(ValueError, match="fraction"):
        spec(metric="KVCache", target=4)


# ------------------------------------------------------------------------------ properties

specs = st.builds(
    lambda lo, span, metric, target, delay: spec(minReplicas=lo, maxReplicas=max(1, lo + span), metric=metric,
                                                 target=target, scaleDownDelay=f"{delay}s"),
    st.integers(0, 3), st.integers(0, 6), st.sampled_from(["InFlight", "Waiting", "KVCache"]),
    st.sampled_from([0.25, 0.5, 1.0]), st.integers(1, 300),
)
steps = st.lists(
    st.tuples(st.floats(0, 200), st.one_of(st.none(), st.floats(0, 40)), st.integers(0, 3), st.booleans(),
              st.integers(0, 3)),
    min_size=1, max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(specs, steps)
def test_decisions_keep_their_promises(s: AutoscalingSpec, sequence: list) -> None:
    previous: AutoscalingStatus | None = None
    now = 0.0
    changed_at = 0.0  # when desired last changed
    window: list[int] = []  # what was asked since demand went below desired
    started_at = 0.0  # when replicas were last seen starting
    for dt, value, starting, active, held in sequence:
        now += dt
        ready = previous.desired_replicas if previous else 1
        load = at(now, value, ready=ready, starting=starting, active=active, held=held)
        before = previous.desired_replicas if previous else initial_replicas(s)
        asked = recommend(s, load)
        d = decide(s, previous, load)
        if starting:
            started_at = now
        after = d.status.desired_replicas
        assert s.min_replicas <= after <= s.max_replicas
        if held:
            assert after >= 1  # held requests always get a replica
        if asked is not None and asked > before:
            assert after == asked  # up at once
        if asked is None and not held:
            assert after == before  # no reading: nothing changes
        if after < before:
            assert starting == 0  # never removes replicas that are still starting
            assert now - changed_at >= s.scale_down_delay_seconds  # no flapping
            assert now - started_at >= s.scale_down_delay_seconds  # every replica got the delay to serve
            assert asked is not None and asked < before
            assert after == max([*window, asked])  # to the most asked within the window
        if after != before:
            changed_at = now
            window = []
        elif asked is not None and asked < after:
            window = [asked] if starting else [*window, asked]  # the window restarts while replicas start
        else:
            window = []
        assert (d.event is not None) == (previous is not None and after != before)
        previous = d.status
