"""The canary verdict: decided here, from one window's figures and the spec's thresholds.

Fewer than ``minRequests`` canary requests is *Inconclusive* (never a pass; the next window grows over
this one, `growth`); otherwise *Fail* when any threshold is exceeded (error rate, timeout rate, p99
latency above stable's, TTFT p95), else *Pass*. Timeouts (the router's ``code="timeout"``) are not errors: they have their own limit. The
reasons say which figure broke which limit; they end up in status and in Events.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from folio.operator.analysis.windows import Figures
from folio.operator.spec import AnalysisSample, AnalysisSpec, as_utc, now_iso


def judge(figures: Figures, spec: AnalysisSpec, now: datetime, notes: Sequence[str] = (), *,
          since: datetime | None = None, grown: bool = False) -> AnalysisSample:
    """The verdict on one window (an interval, or more: ``grown``, since ``since``), with the figures and the
    reasons behind it."""
    requests, errors = round(figures.requests), round(figures.errors)
    rate = errors / requests if requests else 0.0
    timeouts = round(figures.timeouts)
    timeout_rate = timeouts / requests if requests else 0.0
    reasons: list[str] = list(notes)
    span = f"the {_seconds(since, now)} since {now_iso(as_utc(since))}" if grown and since is not None else ""
    if requests < spec.min_requests:
        verdict = "Inconclusive"
        where = span or "the interval"
        reasons.append(f"only {requests} canary requests in {where} (minRequests {spec.min_requests})")
    else:
        failures = []
        if rate > spec.max_error_rate:
            failures.append(
                f"error rate {rate:.2%} ({errors}/{requests}) exceeds maxErrorRate {spec.max_error_rate:.2%}"
            )
        if timeout_rate > spec.max_timeout_rate:
            failures.append(
                f"timeout rate {timeout_rate:.2%} ({timeouts}/{requests}) exceeds maxTimeoutRate "
                f"{spec.max_timeout_rate:.2%} (requestTimeout {spec.request_timeout})"
            )
        p99, stable_p99 = figures.latency_p99_ms, figures.stable_latency_p99_ms
        if p99 is not None and stable_p99 is not None:
            increase = p99 - stable_p99
            if increase > spec.max_latency_p99_increase_ms:
                failures.append(
                    f"p99 latency {p99:.0f} ms is {increase:.0f} ms above stable's {stable_p99:.0f} ms "
                    f"(maxLatencyP99IncreaseMs {spec.max_latency_p99_increase_ms:g})"
                )
        ttft = figures.ttft_p95_ms
        if ttft is not None and ttft > spec.max_time_to_first_token_p95_ms:
            failures.append(
                f"TTFT p95 {ttft:.0f} ms exceeds maxTimeToFirstTokenP95Ms "
                f"{spec.max_time_to_first_token_p95_ms:g}"
            )
        share = shadow_match_rate(figures)
        if spec.min_shadow_match_rate is not None and share is not None and share < spec.min_shadow_match_rate:
            failures.append(
                f"shadow match rate {share:.2%} ({round(figures.shadow_matches)}/{round(figures.shadow_compared)}) "
                f"is below minShadowMatchRate {spec.min_shadow_match_rate:.2%}"
            )
        verdict = "Fail" if failures else "Pass"
        reasons += failures or ["error rate, timeout rate, latency and time to first token within limits"]
        if span:  # after the figures' reasons: a rollback's message leads with what broke
            reasons.append(f"judged on {span} (no single interval had minRequests {spec.min_requests})")
    return AnalysisSample(
        at=now_iso(as_utc(now)),
        requests=requests,
        errors=errors,
        error_rate=rate,
        latency_p99_ms=figures.latency_p99_ms,
        stable_latency_p99_ms=figures.stable_latency_p99_ms,
        ttft_p95_ms=figures.ttft_p95_ms,
        timeouts=timeouts,
        timeout_rate=timeout_rate,
        shadow_match_rate=shadow_match_rate(figures),
        verdict=verdict,
        reasons=reasons,
        since=now_iso(as_utc(since)) if since is not None else None,
    )


def _seconds(since: datetime, now: datetime) -> str:
    return f"{max(0.0, (as_utc(now) - as_utc(since)).total_seconds()):.0f} s"


def shadow_match_rate(figures: Figures) -> float | None:
    """The share of compared shadow answers that matched; None when none was compared."""
    if figures.shadow_compared < 1:
        return None
    return figures.shadow_matches / figures.shadow_compared
