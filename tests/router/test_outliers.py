"""Envoy-style outlier detection: streaks, growing ejections, the percentage cap, half-open readmission."""

from __future__ import annotations

import pytest

from folio.operator.router.outliers import MAX_EJECTION_TIME, OutlierDetection, OutlierDetector, is_failure
from folio.operator.serving.router import RouterConfig


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def detector(**settings: object) -> tuple[OutlierDetector, Clock, list[tuple[str, bool]]]:
    clock = Clock()
    d = OutlierDetector(OutlierDetection(**settings), clock=clock)
    changes: list[tuple[str, bool]] = []
    d.on_change = lambda replica, ejected: changes.append((replica, ejected))
    return d, clock, changes


POOL = ("a", "b", "c", "d")


def fail(d: OutlierDetector, replica: str, times: int, pool: tuple[str, ...] = POOL) -> list[bool]:
    return [d.record(replica, True, pool) for _ in range(times)]


def test_consecutive_errors_eject_and_a_success_resets_the_streak():
    d, _, changes = detector(consecutive_errors=3)
    assert fail(d, "a", 2) == [False, False]
    d.record("a", False, POOL)
    assert fail(d, "a", 2) == [False, False] and d.usable("a")
    assert fail(d, "a", 1) == [True]
    assert d.ejected("a") and not d.usable("a") and changes == [("a", True)]


def test_ejection_time_grows_with_each_ejection_and_is_capped():
    d, clock, _ = detector(consecutive_errors=1, base_ejection_time="100s")
    durations = []
    for _ in range(5):
        start = clock.now
        fail(d, "a", 1)
        clock.now += 1
        while not d.usable("a"):
            clock.now += 1
        durations.append(clock.now - start)
        d.started("a")
        d.record("a", False, POOL)  # readmitted
        assert not d.ejected("a")
    assert durations == [100, 200, 300, MAX_EJECTION_TIME, MAX_EJECTION_TIME]


def test_half_open_lets_one_request_through_and_a_failure_ejects_again_for_longer():
    d, clock, changes = detector(consecutive_errors=2, base_ejection_time="30s")
    fail(d, "a", 2)
    clock.now += 29.9
    assert not d.usable("a")
    clock.now += 0.1
    assert d.usable("a")
    d.started("a")
    assert not d.usable("a"), "only one trial request while half-open"
    assert d.record("a", True, POOL), "a failed trial ejects at once"
    clock.now += 59.9
    assert not d.usable("a")
    clock.now += 0.1
    d.started("a")
    d.record("a", False, POOL)
    assert d.usable("a") and not d.ejected("a")
    assert changes == [("a", True), ("a", False)]


@pytest.mark.parametrize(("percent", "pool", "most"), [(50, POOL, 2), (50, ("a", "b"), 1), (50, ("a",), 0),
                                                       (100, POOL, 4), (10, POOL, 0), (0, POOL, 0)])
def test_never_more_than_max_ejection_percent_of_a_revision(percent, pool, most):
    d, _, _ = detector(consecutive_errors=1, max_ejection_percent=percent)
    for replica in pool:
        fail(d, replica, 1, pool)
    assert sum(d.ejected(r) for r in pool) == most
    # the ones kept in rotation keep failing: still no more ejections
    for replica in pool:
        fail(d, replica, 3, pool)
    assert sum(d.ejected(r) for r in pool) == most


def test_load_shedding_never_counts():
    assert not is_failure(429, retry_after=False)
    assert not is_failure(503, retry_after=True)
    assert is_failure(503, retry_after=False)
    assert is_failure(500, retry_after=True)
    assert is_failure(None, retry_after=False)
    assert not is_failure(200, retry_after=False) and not is_failure(404, retry_after=False)


def test_forget_drops_replicas_that_left():
    d, _, changes = detector(consecutive_errors=1)
    fail(d, "a", 1)
    d.forget({"b"})
    assert not d.ejected("a") and d.usable("a")
    assert changes == [("a", True), ("a", False)]  # the ejected gauge of a gone replica does not stay at 1
    d.forget(set())
    assert len(changes) == 2


def test_router_config_takes_the_spec_object_and_drops_a_bad_one():
    config = RouterConfig.parse(
        {"traffic": [{"revision": "r1", "weight": 100}], "endpoints": {"r1": ["http://127.0.0.1:1"]},
         "outlierDetection": {"consecutiveErrors": 3, "baseEjectionTime": "10s", "maxEjectionPercent": 25}}
    )
    assert config.outlier_detection == OutlierDetection(consecutive_errors=3, base_ejection_time="10s",
                                                        max_ejection_percent=25)
    assert config.outlier_detection.base_ejection_seconds == 10.0
    assert RouterConfig.parse({}).outlier_detection == OutlierDetection()
    bad = RouterConfig.parse({"traffic": [{"revision": "r1", "weight": 100}],
                              "outlierDetection": {"consecutiveErrors": 0}})
    assert bad.outlier_detection == OutlierDetection()
    assert any("outlierDetection" in p for p in bad.problems)
    assert "outlierDetection" in config.to_wire()
