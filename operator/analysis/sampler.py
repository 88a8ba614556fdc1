"""When to take an analysis sample, and from which source: the same for the operator and `folio up`.

One sample per ``analysis.interval``, on the caller's clock, at deadlines a whole interval apart
(a late pass does not push the next sample later), restarted when a canary starts taking traffic
(`restart`): its k-th sample is due k intervals after that, so ``failureLimit`` failing samples
roll it back ``failureLimit × interval`` after it took traffic. The caller wakes up at the
deadline (`until_due`). Routers are scraped every interval even while no canary takes traffic, so
that a canary's first interval already has a baseline and yields a real sample rather than an
inconclusive one. Where the routers are is the caller's
business: the operator finds its router pods, `folio up` has one router on a known port.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import httpx

from folio.operator.analysis.growth import next_window
from folio.operator.analysis.prometheus import prometheus_sample
from folio.operator.analysis.router_scrape import RouterScrapes, Scraped, scrape_routers
from folio.operator.spec import AnalysisSample, AnalysisSpec, RolloutStatus, as_utc


class IntervalSampler:
    def __init__(self, isvc: str, adapter: str | None = None) -> None:
        self.isvc = isvc
        self.scrapes = RouterScrapes(isvc, adapter)  # an adapter's: its revisions' series (status is its own)
        self._next: datetime | None = None  # when the next sample is due
        self._canary: str | None = None  # the serving canary the deadlines count from

    def due(self, spec: AnalysisSpec, now: datetime) -> bool:
        """True once per interval; a True answer sets the next deadline one interval after this one
        (after ``now`` when more than an interval late; a clock set back starts afresh)."""
        now = as_utc(now)
        interval = timedelta(seconds=spec.interval_seconds)
        deadline = self._next
        if deadline is not None and deadline - interval <= now < deadline:
            return False
        following = deadline + interval if deadline is not None else now + interval
        self._next = following if now < following <= now + interval else now + interval
        return True

    def restart(self, spec: AnalysisSpec, status: RolloutStatus, now: datetime) -> None:
        """Call after each decision: a canary that has just started taking traffic gets its first
        sample one whole interval from ``now``."""
        canary = status.serving_canary
        if canary is not None and canary != self._canary:
            self._next = as_utc(now) + timedelta(seconds=spec.interval_seconds)
        self._canary = canary

    def requeue(self, requeue_after: float | None, status: RolloutStatus, now: datetime) -> float | None:
        """When to look again: the decision's ``requeue_after``, or sooner when a serving canary's next
        sample is due."""
        due = self.until_due(now) if status.serving_canary is not None else None
        if due is None:
            return requeue_after
        return due if requeue_after is None else min(requeue_after, due)

    def until_due(self, now: datetime) -> float | None:
        """Seconds until the next sample is due (0 when overdue); None before the first."""
        if self._next is None:
            return None
        return max(0.0, (self._next - as_utc(now)).total_seconds())

    async def take(
        self,
        client: httpx.AsyncClient,
        router_urls: Sequence[str],
        *,
        status: RolloutStatus,
        spec: AnalysisSpec,
        now: datetime,
        scraped: Scraped | None = None,
    ) -> AnalysisSample | None:
        """Scrape now (every router's ``/metrics`` in ``router_urls``, or Prometheus); a sample when the
        canary takes traffic, else None (only the baseline moves). ``scraped``: the routers' texts and notes,
        scraped already this pass (several adapters' samplers share one scrape)."""
        canary, stable = status.serving_canary, status.stable_revision
        window = next_window(status, spec, now)  # the interval, or more while the step is Inconclusive
        if spec.prometheus is not None:
            if canary is None:
                return None
            return await prometheus_sample(client, spec.prometheus.url, self.isvc, canary, stable, spec, now,
                                           self.scrapes.adapter, window)
        texts, notes = scraped if scraped is not None else await scrape_routers(client, router_urls)
        if canary is None:
            self.scrapes.ingest(texts)  # keeps the baseline current
            return None
        return self.scrapes.sample(texts, canary, stable, spec, now, notes, window)
