"""The canary verdict: figures held to the spec's thresholds."""

from __future__ import annotations

from folio.operator.analysis.verdict import judge
from folio.operator.analysis.windows import Figures
from folio.operator.spec import AnalysisSpec
from tests.rollout.helpers import T0

SPEC = AnalysisSpec(minRequests=50, maxErrorRate=0.05, maxLatencyP99IncreaseMs=50, maxTimeToFirstTokenP95Ms=500)


def test_verdicts_and_their_reasons() -> None:
    ok = Figures(requests=100, errors=1, latency_p99_ms=130, stable_latency_p99_ms=100, ttft_p95_ms=200)
    assert judge(ok, SPEC, T0).verdict == "Pass"
    few = Figures(requests=49, errors=49, latency_p99_ms=None, stable_latency_p99_ms=None, ttft_p95_ms=None)
    inconclusive = judge(few, SPEC, T0)
    assert inconclusive.verdict == "Inconclusive"
    assert inconclusive.reasons == ["only 49 canary requests in the interval (minRequests 50)"]
    slow_ttft = Figures(requests=100, errors=0, latency_p99_ms=100, stable_latency_p99_ms=100, ttft_p95_ms=800)
    failed = judge(slow_ttft, SPEC, T0)
    assert failed.verdict == "Fail"
    assert failed.reasons == ["TTFT p95 800 ms exceeds maxTimeToFirstTokenP95Ms 500"]
    assert failed.at == "2026-03-01T12:00:00Z"


def test_timeouts_have_their_own_limit_and_are_not_errors() -> None:
    def figures(timeouts: int) -> Figures:
        return Figures(requests=100, errors=0, latency_p99_ms=100, stable_latency_p99_ms=100, ttft_p95_ms=200,
                       timeouts=timeouts)  # fmt: skip

    within = judge(figures(5), SPEC, T0)
    assert within.verdict == "Pass" and (within.timeouts, within.timeout_rate) == (5, 0.05)
    over = judge(figures(6), SPEC, T0)
    assert over.verdict == "Fail" and over.error_rate == 0.0
    assert over.reasons == ["timeout rate 6.00% (6/100) exceeds maxTimeoutRate 5.00% (requestTimeout 60s)"]
def test_shadow_match_rate_below_the_minimum_fails_a_sample() -> None:
    from folio.operator import metric_names as m
    from folio.operator.analysis.windows import delta, figures_from_windows, parse_router_metrics

    spec = SPEC.model_copy(update={"min_shadow_match_rate": 0.95})

    def scrape(match: int, mismatch: int) -> str:
        lines = [f'{m.REQUESTS}{{isvc="s",revision="c",code="200"}} 100']
        for result, n in (("match", match), ("mismatch", mismatch)):
            lines.append(f'{m.SHADOW_COMPARISONS}{{isvc="s",revision="c",result="{result}"}} {n}')
        return "\n".join(lines) + "\n"

    before, after = parse_router_metrics(scrape(10, 0), "s"), parse_router_metrics(scrape(90, 20), "s")
    window = delta(after, before)
    figures = figures_from_windows(window, "c", None)
    assert (figures.shadow_matches, figures.shadow_compared) == (80, 100)
    figures = Figures(requests=100, errors=0, latency_p99_ms=None, stable_latency_p99_ms=None, ttft_p95_ms=None,
                      shadow_matches=80, shadow_compared=100)
    sample = judge(figures, spec, T0)
    assert sample.verdict == "Fail" and sample.shadow_match_rate == 0.8
    assert "shadow match rate 80.00% (80/100) is below minShadowMatchRate 95.00%" in sample.reasons
    # no comparison in the interval: the threshold cannot judge, the others still do
    none = Figures(requests=100, errors=0, latency_p99_ms=None, stable_latency_p99_ms=None, ttft_p95_ms=None)
    assert judge(none, spec, T0).verdict == "Pass" and judge(none, spec, T0).shadow_match_rate is None
    assert judge(figures, SPEC, T0).verdict == "Pass"  # not asked for
