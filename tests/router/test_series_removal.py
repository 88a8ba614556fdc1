"""Series of revisions and replicas that left the config leave /metrics; so do a deleted service's."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from folio.operator import metric_names as m
from folio.operator.controller import metrics as operator_metrics
from folio.operator.router.metrics import RouterMetrics
from tests.router.conftest import RouterFactory, RouterUnderTest
from tests.router.upstreams import FakeUpstream, serving
from tests.support.wait import until

PER_REVISION = (m.REQUESTS, m.DURATION, m.TTFT, m.IN_FLIGHT)


async def _series(r: RouterUnderTest) -> list[tuple[str, dict[str, str]]]:
    """Every sample on the router's /metrics page, as (name, labels)."""
    resp = await r.client.get("/metrics")
    assert resp.status_code == 200
    return [(s.name, s.labels) for family in text_string_to_metric_families(resp.text) for s in family.samples]


def _revisions(series: list[tuple[str, dict[str, str]]], *names: str) -> set[str]:
    return {labels[m.REVISION] for name, labels in series if name.startswith(names) and m.REVISION in labels}


async def test_only_the_current_revisions_have_series(router: RouterFactory) -> None:
    up = FakeUpstream("engine")
    now = [0.0]
    async with serving(up), router() as r:
        metrics = r.app.metrics
        metrics.clock = lambda: now[0]
        grace = metrics.series_grace_s
        left_at: dict[str, float] = {}  # what the router should do, written out
        for i in range(1, 6):  # r1..r5, each the only revision with traffic in turn, r(i-1) draining beside it
            now[0] += 0.7 * grace  # a revision's series outlive its leaving by one step, not two
            new, old = f"r{i}", f"r{i - 1}"
            endpoints = {new: [up.url], **({old: [up.url]} if i > 1 else {})}
            r.set(traffic=[{"revision": new, "weight": 100}], stable=new, endpoints=endpoints)
            if i > 2:
                left_at[f"r{i - 2}"] = now[0]
            assert (await r.complete(stream=True)).status_code == 200
            assert (await r.complete()).status_code == 200
            series = await _series(r)
            assert _revisions(series, m.WEIGHT) == {new}
            lately = {rev for rev, at in left_at.items() if now[0] - at < grace}
            assert _revisions(series, *PER_REVISION) == set(endpoints) | lately  # older ones are gone
        assert _revisions(await _series(r), "folio_router_") == {"r1", "r2", "r3", "r4", "r5"} - {"r1"}

        r.set(traffic=[{"revision": "r5", "weight": 100}], stable="r5", endpoints={"r5": [up.url]})
        now[0] += grace  # /metrics itself notices the grace is over
        series = await _series(r)
        assert _revisions(series, "folio_router_") == {"r5"}
        assert r.metric(m.REQUESTS, revision="r5", code="200") == 2

        # a revision that comes back starts from zero
        r.set(traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [up.url]})
        assert (await r.complete()).status_code == 200
        assert r.metric(m.REQUESTS, revision="r1", code="200") == 1
        now[0] += grace
        assert _revisions(await _series(r), "folio_router_") == {"r1"}


async def test_an_ejected_replica_that_is_removed_leaves_no_gauge(router: RouterFactory) -> None:
    good, bad = FakeUpstream("good"), FakeUpstream("bad", status=500)
    async with serving(good, bad), router(
        traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [good.url, bad.url]},
        outlierDetection={"consecutiveErrors": 1, "baseEjectionTime": "300s"},
        loadBalancing={"strategy": "LeastLoaded"},  # idle replicas take turns: `bad` gets a request soon
    ) as r:  # fmt: skip
        now = [0.0]
        r.app.metrics.clock = lambda: now[0]
        await until(lambda: _complete_until_ejected(r, bad), what="the failing replica ejected")

        def replicas(series: list[tuple[str, dict[str, str]]], metric: str) -> set[str]:
            return {labels[m.REPLICA] for name, labels in series if name.startswith(metric)}

        assert replicas(await _series(r), m.EJECTED) == {bad.url}
        r.set(traffic=[{"revision": "r1", "weight": 100}], stable="r1", endpoints={"r1": [good.url]})
        series = await _series(r)
        assert replicas(series, m.EJECTED) == set()
        assert r.app.metrics.registry.get_sample_value(m.EJECTED, {"isvc": "chat", "revision": "r1",
                                                                   "replica": bad.url}) is None
        # the count stays with the revision (a replica that died is ejected and gone at once)...
        assert replicas(series, m.EJECTIONS) == {bad.url}
        r.set(traffic=[{"revision": "r2", "weight": 100}], stable="r2", endpoints={"r2": [good.url]})
        assert replicas(await _series(r), m.EJECTIONS) == {bad.url}  # ...left with it, for the grace
        now[0] += r.app.metrics.series_grace_s
        assert replicas(await _series(r), m.EJECTIONS) == set()  # ...and goes with it


async def _complete_until_ejected(r: RouterUnderTest, bad: FakeUpstream) -> bool:
    assert (await r.complete()).status_code == 200  # a failed attempt is retried on the good replica
    return r.metric(m.EJECTED, revision="r1", replica=bad.url) == 1


def test_late_updates_of_a_removed_revision_do_not_bring_its_series_back() -> None:
    now = [0.0]
    metrics = RouterMetrics("chat", clock=lambda: now[0])
    metrics.retain({"r1", "r2"}, {("r1", "http://a"), ("r2", "http://b")})
    metrics.attempt_started("r2")
    metrics.retry("r2", "r1")
    metrics.replica_ejected("r2", "http://b", True)
    metrics.shadow_compared("r2", "match", 0.1)
    metrics.retain({"r1"}, {("r1", "http://a")})
    metrics.attempt_finished("r2", "200", 0.5)  # within the grace: still counted
    assert 'revision="r2"' in metrics.render().decode()
    now[0] += metrics.series_grace_s
    assert 'revision="r2"' not in metrics.render().decode()
    metrics.attempt_finished("r2", "200", 0.5)  # an attempt that outlived its revision's series
    metrics.shadowed("r2", "200", 0.5)
    metrics.replica_ejected("r2", "http://b", False)
    metrics.retry("r1", "overflow")
    metrics.attempt_finished("overflow", "200", 0.1)
    page = metrics.render().decode()
    assert 'revision="r2"' not in page and "r2" not in page
    assert 'to_revision="overflow"' in page and 'revision="overflow"' in page


def test_a_deleted_inference_service_leaves_no_operator_series() -> None:
    failed = operator_metrics.REVISIONS_FAILED
    for isvc, reason in [("gone", "WeightsFailed"), ("gone", "AnalysisFailed"), ("kept", "WeightsFailed")]:
        failed.labels(namespace="series-test", isvc=isvc, reason=reason).inc()
    failed.labels(namespace="other-ns", isvc="gone", reason="WeightsFailed").inc()
    try:
        operator_metrics.forget_isvc("series-test", "gone")
        left = {(s.labels["namespace"], s.labels["isvc"]) for f in failed.collect() for s in f.samples}
        assert ("series-test", "gone") not in left
        assert {("series-test", "kept"), ("other-ns", "gone")} <= left
        operator_metrics.forget_isvc("series-test", "never-was")  # nothing to remove: no error
    finally:
        for isvc in ("gone", "kept"):
            operator_metrics.forget_isvc("series-test", isvc)
        operator_metrics.forget_isvc("other-ns", "gone")
