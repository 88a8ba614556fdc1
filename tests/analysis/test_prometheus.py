"""The Prometheus source: the same figures by PromQL, from a Prometheus HTTP API."""

from __future__ import annotations

import httpx
import pytest

from folio.operator.analysis.prometheus import prometheus_sample, promql_queries
from folio.operator.spec import AnalysisSpec
from tests.rollout.helpers import T0

SPEC = AnalysisSpec(minRequests=50, maxErrorRate=0.05, maxLatencyP99IncreaseMs=50, maxTimeToFirstTokenP95Ms=500)


def prometheus(answers: dict[str, object], seen: list[str]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        seen.append(query)
        for key, value in answers.items():
            if key in query:
                result = [] if value is None else [{"metric": {}, "value": [0, str(value)]}]
                return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})
        return httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "unexpected"})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def test_prometheus_figures_and_verdict() -> None:
    seen: list[str] = []
    answers = {
        'code=~"5..|error"': 12,
        'code="timeout"': 7,
        "histogram_quantile(0.99": 0.2,  # both canary and stable: no increase
        "histogram_quantile(0.95": 0.3,
        "folio_router_requests_total": 100,
    }
    async with prometheus(answers, seen) as client:
        sample = await prometheus_sample(client, "http://prom:9090", "chat", "c1", "s1", SPEC, T0)
    assert (sample.requests, sample.errors, sample.timeouts, sample.verdict) == (100, 12, 7, "Fail")
    assert any("timeout rate 7.00% (7/100) exceeds maxTimeoutRate 5.00%" in r for r in sample.reasons)
    assert sample.latency_p99_ms == pytest.approx(200) and sample.ttft_p95_ms == pytest.approx(300)
    assert set(seen) == set(promql_queries("chat", "c1", "s1", "30s").values())
    assert all('isvc="chat"' in q and "[30s]" in q for q in seen)


async def test_prometheus_down_or_empty_is_inconclusive() -> None:
    async with prometheus({}, []) as client:
        sample = await prometheus_sample(client, "http://prom:9090", "chat", "c1", "s1", SPEC, T0)
    assert sample.verdict == "Inconclusive"
    assert "could not be queried" in sample.reasons[0]
    async with prometheus({"histogram_quantile": None, "folio_router_requests_total": None}, []) as client:
        sample = await prometheus_sample(client, "http://prom:9090", "chat", "c1", "s1", SPEC, T0)
    assert sample.verdict == "Inconclusive" and sample.latency_p99_ms is None


async def test_an_adapters_sample_queries_that_adapters_series() -> None:
    seen: list[str] = []
    answers = {"histogram_quantile": 0.1, "folio_router_requests_total": 80}
    async with prometheus(answers, seen) as client:
        sample = await prometheus_sample(client, "http://prom:9090", "chat", "s2", "s1", SPEC, T0, adapter="sql")
    assert sample.requests == 80
    assert set(seen) == set(promql_queries("chat", "s2", "s1", "30s", adapter="sql").values())
    assert all('adapter="sql"' in q and 'revision="' not in q.replace("adapter_revision", "") for q in seen)
