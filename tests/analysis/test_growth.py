"""The growing analysis window: a quiet canary judged on what it accumulated since its step began."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from folio.operator.analysis.growth import Window, carry, next_window, promql_range, snapshot
from folio.operator.analysis.prometheus import prometheus_sample
from folio.operator.analysis.router_scrape import RouterScrapes
from folio.operator.analysis.windows import histogram_quantile, merge, parse_router_metrics
from folio.operator.spec import (
    AnalysisSample,
    AnalysisSpec,
    CanaryStatus,
    InferenceServiceStatus,
    TrafficTarget,
    now_iso,
)
from tests.analysis.helpers import Router
from tests.rollout.helpers import T0

SPEC = AnalysisSpec(interval="3s", minRequests=4, maxErrorRate=0.05)  # the reported service's settings
STEP = T0


def status(last: AnalysisSample | None = None, step_started: datetime = STEP) -> InferenceServiceStatus:
    """The canary r2 at 25% since ``step_started``, its latest sample ``last``."""
    return InferenceServiceStatus(
        stable_revision="r1", canary_revision="r2",
        traffic=[TrafficTarget(revision="r1", weight=75), TrafficTarget(revision="r2", weight=25)],
        canary=CanaryStatus(step=1, weight=25, step_started_at=now_iso(step_started), last_analysis=last),
    )


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_fresh_window_is_one_interval_never_before_the_step() -> None:
    assert next_window(InferenceServiceStatus(), SPEC, at(30)) == Window(at(27))
    assert next_window(status(), SPEC, at(30)) == Window(at(27))
    assert next_window(status(), SPEC, at(1)) == Window(at(0))  # the step began a second ago


def test_the_window_grows_after_an_inconclusive_sample_of_the_step() -> None:
    last = AnalysisSample(at=now_iso(at(6)), since=now_iso(at(3)), verdict="Inconclusive", requests=1)
    window = next_window(status(last), SPEC, at(9))
    assert window.grown and window.since == at(3) and promql_range(window, SPEC, at(9)) == "6s"
    # not after a conclusive one, nor one taken before the step began
    assert not next_window(status(last.model_copy(update={"verdict": "Pass"})), SPEC, at(9)).grown
    assert not next_window(status(last, step_started=at(7)), SPEC, at(9)).grown
    assert promql_range(Window(at(6)), SPEC, at(9)) == "3s"


def feed(router: Router, revision: str, n: int, seconds: float = 0.02) -> None:
    for _ in range(n):
        router.serve(revision, "200", seconds, ttft=0.01)


def test_the_reported_case_is_judged_on_the_accumulated_requests() -> None:
    """minRequests 4 every 3 s, and one canary request an interval (fewer than minRequests, as in the
    reported case): Inconclusive three times, then judged (a Pass) on the four requests since the step's first
    interval began."""
    router, scrapes = Router(), RouterScrapes("chat")
    scrapes.ingest({"pod": router.text()})  # the baseline
    st, samples = status(), []
    for k in range(1, 5):
        feed(router, "r1", 3, 0.05)
        feed(router, "r2", 1)
        now = at(3 * k)
        sample = scrapes.sample({"pod": router.text()}, "r2", "r1", SPEC, now, window=next_window(st, SPEC, now))
        samples.append(sample)
        st = status(sample.model_copy(update={"at": now_iso(now)}))
    assert [s.verdict for s in samples] == ["Inconclusive"] * 3 + ["Pass"]
    assert [s.requests for s in samples] == [1, 2, 3, 4]
    assert {s.since for s in samples} == {now_iso(at(0))}
    assert all(s.accumulated for s in samples[:3]) and samples[3].accumulated is None
    assert any("judged on the 12 s since" in r for r in samples[3].reasons)
    # p99s over the whole window: the canary's 20 ms requests against stable's 50 ms ones
    assert samples[3].latency_p99_ms is not None and samples[3].latency_p99_ms <= 20.0 + 1e-6
    assert samples[3].stable_latency_p99_ms is not None and samples[3].stable_latency_p99_ms > 40.0
    # the next sample starts a window of its own
    assert not next_window(status(samples[3].model_copy(update={"at": now_iso(at(12))})), SPEC, at(15)).grown


def test_a_restarted_operator_keeps_growing_the_window_from_status() -> None:
    router = Router()
    before = RouterScrapes("chat")
    before.ingest({"pod": router.text()})
    feed(router, "r2", 2)
    first = before.sample({"pod": router.text()}, "r2", "r1", SPEC, at(3), window=next_window(status(), SPEC, at(3)))
    assert (first.verdict, first.requests) == ("Inconclusive", 2)
    st = status(AnalysisSample.model_validate(first.to_wire() | {"at": now_iso(at(3))}))  # through the wire
    after = RouterScrapes("chat")  # a new operator: no previous scrape in memory
    feed(router, "r2", 5)  # not counted: happened before its baseline
    baseline = after.sample({"pod": router.text()}, "r2", "r1", SPEC, at(6), window=next_window(st, SPEC, at(6)))
    assert (baseline.verdict, baseline.requests, baseline.since) == ("Inconclusive", 2, now_iso(at(0)))
    st = status(baseline.model_copy(update={"at": now_iso(at(6))}))
    feed(router, "r2", 2)
    judged = after.sample({"pod": router.text()}, "r2", "r1", SPEC, at(9), window=next_window(st, SPEC, at(9)))
    assert (judged.verdict, judged.requests, judged.since) == ("Pass", 4, now_iso(at(0)))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.0005, 120.0), min_size=1, max_size=60), st.floats(0.01, 0.999))
def test_the_counters_kept_in_status_give_the_same_quantiles(observations: list[float], q: float) -> None:
    """`carry` leaves out buckets, never a quantile's worth: the figures of a window read back from status are
    the window's own."""
    router = Router()
    for seconds in observations:
        router.serve("r2", "200", seconds, ttft=seconds / 2)
    router.serve("r1", "200", 0.03)
    window = parse_router_metrics(router.text(), "chat")
    kept = snapshot(carry(window, "r2", "r1"))
    for hist in ("duration", "ttft"):
        whole, trimmed = getattr(window["r2"], hist), getattr(kept["r2"], hist)
        assert len(trimmed) <= len(whole)
        a, b = histogram_quantile(q, whole), histogram_quantile(q, trimmed)
        assert a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    assert kept["r2"].codes == window["r2"].codes
    assert histogram_quantile(q, kept["r1"].duration) == histogram_quantile(q, window["r1"].duration)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0005, 120.0), min_size=1, max_size=30),
       st.lists(st.floats(0.0005, 120.0), max_size=30), st.floats(0.01, 0.999))
def test_a_grown_window_adds_the_kept_counters_and_the_next_interval_exactly(
        before: list[float], after: list[float], q: float) -> None:
    """The counters kept in status (trimmed) plus the next interval's (every bucket) give the quantiles of all
    the window's requests. (Found in CI: adding bucket by bucket left the bounds status had trimmed above its
    requests without them, and the canary's p99 read 60 s.)"""
    first, second = Router(), Router()
    for router, observations in ((first, before), (second, after)):
        for seconds in observations:
            router.serve("r2", "200", seconds, ttft=seconds / 2)
        router.serve("r1", "200", 0.03)
    one, two = (parse_router_metrics(r.text(), "chat") for r in (first, second))
    grown = merge([snapshot(carry(one, "r2", "r1")), two])
    whole = merge([one, two])
    for hist in ("duration", "ttft"):
        a, b = histogram_quantile(q, getattr(whole["r2"], hist)), histogram_quantile(q, getattr(grown["r2"], hist))
        assert a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    assert grown["r2"].codes == whole["r2"].codes
    assert histogram_quantile(q, grown["r1"].duration) == histogram_quantile(q, whole["r1"].duration)


async def test_prometheus_asks_for_the_whole_grown_window() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        seen.append(query)
        value = 4 if query.startswith("sum(increase(folio_router_requests_total{") and "code" not in query else 0
        result = [{"metric": {}, "value": [0, str(value)]}]
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    last = AnalysisSample(at=now_iso(at(6)), since=now_iso(at(0)), verdict="Inconclusive", requests=3)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        sample = await prometheus_sample(client, "http://prom:9090", "chat", "r2", "r1", SPEC, at(9),
                                         window=next_window(status(last), SPEC, at(9)))
    assert all("[9s]" in q for q in seen) and sample.verdict == "Pass" and sample.since == now_iso(at(0))
