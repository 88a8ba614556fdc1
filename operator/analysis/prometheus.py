"""The Prometheus analysis source (``analysis.prometheus.url``): the router-scrape figures by PromQL.

Each figure is an instant query of ``increase(...[interval])`` over the router's own series,
evaluated at the sample's time; over a grown window (`growth`) the range is the whole window. Prometheus being unreachable gives an Inconclusive sample, never
a pass.
"""

from __future__ import annotations

import math
from datetime import datetime

import httpx

from folio.operator import metric_names as m
from folio.operator.analysis.growth import Window, promql_range
from folio.operator.analysis.verdict import judge
from folio.operator.analysis.windows import NO_FIGURES, Figures, ms
from folio.operator.spec import AnalysisSample, AnalysisSpec, as_utc


def promql_queries(isvc: str, canary: str, stable: str | None, window: str,
                   adapter: str | None = None) -> dict[str, str]:
    """The PromQL behind each figure; ``window`` is the analysis interval (e.g. ``30s``); ``adapter``: the
    revisions are that adapter's (its requests' series, over every base revision)."""

    def sel(rev: str, extra: str = "") -> str:
        if adapter is not None:
            return f'{{{m.ISVC}="{isvc}",{m.ADAPTER}="{adapter}",{m.ADAPTER_REVISION}="{rev}"{extra}}}'
        return f'{{{m.ISVC}="{isvc}",{m.REVISION}="{rev}"{extra}}}'

    def p(q: float, metric: str, rev: str) -> str:
        return f"histogram_quantile({q}, sum by (le) (increase({metric}_bucket{sel(rev)}[{window}])))"

    errors = f',{m.CODE}=~"5..|error"'
    timeouts = f',{m.CODE}="{m.TIMEOUT}"'
    queries = {
        "requests": f"sum(increase({m.REQUESTS}{sel(canary)}[{window}]))",
        "errors": f"sum(increase({m.REQUESTS}{sel(canary, errors)}[{window}]))",
        "timeouts": f"sum(increase({m.REQUESTS}{sel(canary, timeouts)}[{window}]))",
        "latency_p99": p(0.99, m.DURATION, canary),
        "ttft_p95": p(0.95, m.TTFT, canary),
    }
    if stable:
        queries["stable_latency_p99"] = p(0.99, m.DURATION, stable)
    return queries


def _scalar(body: dict) -> float | None:
    """The single value of an instant-query answer; None when empty or NaN (no observations)."""
    if body.get("status") != "success":
        raise ValueError(f"Prometheus answered {body.get('errorType', 'error')}: {body.get('error', body)}")
    result = body["data"]["result"]
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if math.isnan(value) else value


async def prometheus_figures(
    client: httpx.AsyncClient, base_url: str, isvc: str, canary: str, stable: str | None,
    spec: AnalysisSpec, now: datetime, adapter: str | None = None, window: str | None = None,
) -> Figures:
    """The window's figures from Prometheus' HTTP API (instant queries evaluated at ``now``); ``window``: the
    range, by default the interval."""
    values: dict[str, float | None] = {}
    for key, query in promql_queries(isvc, canary, stable, window or spec.interval, adapter).items():
        resp = await client.get(
            f"{base_url.rstrip('/')}/api/v1/query",
            params={"query": query, "time": f"{as_utc(now).timestamp():.3f}"},
            timeout=10.0,
        )
        resp.raise_for_status()
        values[key] = _scalar(resp.json())
    return Figures(
        requests=values["requests"] or 0.0,
        errors=values["errors"] or 0.0,
        latency_p99_ms=ms(values["latency_p99"]),
        stable_latency_p99_ms=ms(values.get("stable_latency_p99")),
        ttft_p95_ms=ms(values["ttft_p95"]),
        timeouts=values["timeouts"] or 0.0,
    )


async def prometheus_sample(
    client: httpx.AsyncClient, base_url: str, isvc: str, canary: str, stable: str | None,
    spec: AnalysisSpec, now: datetime, adapter: str | None = None, window: Window | None = None,
) -> AnalysisSample:
    """`judge` on Prometheus figures over the interval, or over the whole ``window`` when it grew (`growth`);
    an unreachable Prometheus is Inconclusive, never a pass."""
    since, grown = (window.since, window.grown) if window is not None else (None, False)
    try:
        figures = await prometheus_figures(client, base_url, isvc, canary, stable, spec, now, adapter,
                                           promql_range(window, spec, now) if window is not None else None)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return judge(NO_FIGURES, spec, now, [f"Prometheus at {base_url} could not be queried: {exc}"],
                     since=since, grown=grown)
    return judge(figures, spec, now, since=since, grown=grown)
