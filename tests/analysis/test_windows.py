"""Per-revision windows from a router's exposition: codes, buckets, quantiles, and the names they read."""

from __future__ import annotations

import random

import pytest

from folio.operator import metric_names as m
from folio.operator.analysis.windows import histogram_quantile, parse_router_metrics
from tests.analysis.helpers import Router


def test_what_the_router_exports_is_what_the_analysis_reads() -> None:
    r = Router()
    r.serve("c1", "200", 0.02, ttft=0.01)
    names = {line.split("{")[0] for line in r.text().splitlines() if line and not line.startswith("#")}
    assert {m.REQUESTS, f"{m.DURATION}_bucket", f"{m.TTFT}_bucket"} <= names
    window = parse_router_metrics(r.text(), "chat")["c1"]
    assert (window.requests, window.duration[float("inf")], window.ttft[float("inf")]) == (1, 1, 1)


def test_parse_sums_codes_and_reads_buckets_for_one_service_only() -> None:
    r = Router()
    r.serve("c1", "200", 0.02)
    r.serve("c1", "503", 0.01)
    r.serve("c1", "error", 0.001)
    r.serve("c1", "404", 0.01)
    other = Router("another-service")
    other.serve("other", "200", 0.02)
    snap = parse_router_metrics(r.text() + other.text(), "chat")
    assert set(snap) == {"c1"}
    assert snap["c1"].requests == 4 and snap["c1"].errors == 2, "5xx and connection errors, not 4xx"
    assert snap["c1"].duration[float("inf")] == 4


def test_histogram_quantile_lands_in_the_true_quantiles_bucket() -> None:
    rng = random.Random(7)
    r = Router()
    values = sorted(rng.lognormvariate(-2.5, 0.6) for _ in range(5000))
    for v in values:
        r.serve("s", "200", v)
    buckets = parse_router_metrics(r.text(), "chat")["s"].duration
    for q in (0.5, 0.95, 0.99):
        true = values[int(q * len(values)) - 1]
        estimate = histogram_quantile(q, buckets)
        assert estimate is not None
        assert abs(estimate - true) <= 0.005 + 1e-9, (q, estimate, true)


def test_histogram_quantile_edge_cases() -> None:
    inf = float("inf")
    assert histogram_quantile(0.99, {}) is None
    assert histogram_quantile(0.99, {0.1: 0, inf: 0}) is None
    # everything beyond the last finite bound: the histogram can only say "at least 0.5"
    assert histogram_quantile(0.99, {0.1: 0, 0.5: 0, inf: 10}) == 0.5
    # halfway through the first bucket, interpolating from 0
    assert histogram_quantile(0.5, {0.1: 10, inf: 10}) == pytest.approx(0.05)
