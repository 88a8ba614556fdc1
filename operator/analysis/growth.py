"""The growing analysis window: a quiet canary is judged on everything since its step began.

A sample with fewer than ``minRequests`` canary requests is Inconclusive; the next sample then covers that
sample's window as well as its own interval, and so on, until the window holds ``minRequests`` requests and
is judged (Pass or Fail) as a whole. The next sample after a conclusive one, or after a step starts, covers
one interval again. So a service at 0.3 requests a second with ``minRequests: 4``, ``interval: 3s`` and a
25% step (about one canary request in four intervals) is judged on its first four canary requests, about a
minute into the step, instead of being Inconclusive at every interval for ever.

Where the window stands lives in status, in the step's latest sample: its start (``since``) and, for the
router-scrape source, its counters so far (``accumulated``). A restarted operator therefore keeps growing
the same window; it loses only the interval its first scrape spends on a baseline. The Prometheus source
needs only the start: it asks for ``increase(...[now - since])``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from folio.operator.analysis.windows import Buckets, RevisionWindow, Snapshot
from folio.operator.spec import AnalysisSpec, RevisionCounts, RolloutStatus, as_utc, parse_time


@dataclass(frozen=True)
class Window:
    """What the next sample judges."""

    since: datetime  # the window's start
    grown: bool = False  # it continues the window of the step's latest (Inconclusive) sample
    carried: Snapshot = field(default_factory=dict)  # router scrape: the counters it holds already


def next_window(status: RolloutStatus, spec: AnalysisSpec, now: datetime) -> Window:
    """The window of the sample taken at ``now``: the growing one while the step's latest sample was
    Inconclusive, else one interval (never reaching back before the step began)."""
    now = as_utc(now)
    c = status.canary
    step_start = parse_time(c.step_started_at) if c is not None and c.step_started_at else None
    fresh = now - timedelta(seconds=spec.interval_seconds)
    if step_start is not None and fresh < step_start <= now:
        fresh = step_start
    last = c.last_analysis if c is not None else None
    if (last is None or last.verdict != "Inconclusive" or last.at is None or step_start is None
            or parse_time(last.at) <= step_start):
        return Window(fresh)  # a conclusive sample, or none yet in this step: a window of its own
    since = max(parse_time(last.since or last.at), step_start)
    return Window(min(since, now), grown=True, carried=snapshot(last.accumulated))


def promql_range(window: Window, spec: AnalysisSpec, now: datetime) -> str:
    """The range of the PromQL ``increase``: the interval, or the whole grown window (whole seconds, at least
    one interval)."""
    if not window.grown:
        return spec.interval
    seconds = max((as_utc(now) - window.since).total_seconds(), spec.interval_seconds)
    return f"{math.ceil(seconds)}s"


# ------------------------------------------------------------------- counters in status


def carry(window: Snapshot, canary: str, stable: str | None) -> list[RevisionCounts]:
    """What status keeps of an Inconclusive window: the canary's counters and stable's latency histogram (the
    figures read nothing else), buckets no quantile can land in left out."""
    kept = [RevisionCounts(revision=canary, **_counts(window.get(canary, RevisionWindow())))]
    if stable and stable in window:
        kept.append(RevisionCounts(revision=stable, duration=_bucket_text(window[stable].duration)))
    return kept


def snapshot(counts: list[RevisionCounts] | None) -> Snapshot:
    """The counters `carry` kept, as a window again."""
    return {
        c.revision: RevisionWindow(
            codes=dict(c.codes), duration=_buckets(c.duration), ttft=_buckets(c.ttft), shadow=dict(c.shadow)
        )
        for c in counts or ()
    }


def _counts(w: RevisionWindow) -> dict[str, dict[str, float]]:
    return {"codes": dict(w.codes), "duration": _bucket_text(w.duration), "ttft": _bucket_text(w.ttft),
            "shadow": dict(w.shadow)}


def _bucket_text(buckets: Buckets) -> dict[str, float]:
    return {_le_text(le): n for le, n in _trim(buckets).items()}


def _buckets(text: dict[str, float]) -> Buckets:
    return {float(le): n for le, n in text.items()}


def _le_text(le: float) -> str:
    return "+Inf" if math.isinf(le) else repr(le)


def _trim(buckets: Buckets) -> Buckets:
    """The buckets `histogram_quantile` can read: leading empty ones but the last (the lower bound of the first
    that counts), and none between the first holding every observation and ``+Inf``. Exact, and small: a
    quiet canary's histogram has few buckets that matter."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return {}
    total = buckets[bounds[-1]]
    kept: Buckets = {}
    for i, le in enumerate(bounds):
        n = buckets[le]
        following = buckets[bounds[i + 1]] if i + 1 < len(bounds) else total
        if n <= 0 and following <= 0:
            continue  # empty, and so is the next: never a lower bound that is read
        kept[le] = n
        if n >= total:
            break
    kept[bounds[-1]] = total
    return kept
