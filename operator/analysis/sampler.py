"""When to take an analysis sample, and from which source: the same for the operator and `folio up`.

One sample per ``analysis.interval``, on the caller's clock. Routers are scraped every interval
even while no canary takes traffic, so that a canary's first interval already has a baseline and
yields a real sample rather than an inconclusive one. Where the routers are is the caller's
business: the operator finds its router pods, `folio up` has one router on a known port.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import httpx

from folio.operator.analysis.prometheus import prometheus_sample
from folio.operator.analysis.router_scrape import RouterScrapes, scrape_routers
from folio.operator.spec import AnalysisSample, AnalysisSpec, InferenceServiceStatus, as_utc


class IntervalSampler:
    def __init__(self, isvc: str) -> None:
        self.isvc = isvc
        self.scrapes = RouterScrapes(isvc)
        self._last: datetime | None = None  # when the current interval began

    def due(self, spec: AnalysisSpec, now: datetime) -> bool:
        """True once per interval; a True answer starts the next interval (a clock set back starts one too)."""
        now = as_utc(now)
        last = self._last
        if last is not None and last <= now < last + timedelta(seconds=spec.interval_seconds):
            return False
        self._last = now
        return True

    async def take(
        self,
        client: httpx.AsyncClient,
        router_urls: Sequence[str],
        *,
        status: InferenceServiceStatus,
        spec: AnalysisSpec,
        now: datetime,
    ) -> AnalysisSample | None:
        """Scrape now (every router's ``/metrics`` in ``router_urls``, or Prometheus); a sample when the
        canary takes traffic, else None (only the baseline moves)."""
        canary, stable = status.serving_canary, status.stable_revision
        if spec.prometheus is not None:
            if canary is None:
                return None
            return await prometheus_sample(client, spec.prometheus.url, self.isvc, canary, stable, spec, now)
        texts, notes = await scrape_routers(client, router_urls)
        if canary is None:
            self.scrapes.ingest(texts)  # keeps the baseline current
            return None
        return self.scrapes.sample(texts, canary, stable, spec, now, notes)
