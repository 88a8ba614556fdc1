"""Analysis samples for the local runtime: its one router's /metrics (or Prometheus), every interval.

The figures and the verdict come from `folio.operator.analysis`, the code the operator uses. The
router is scraped every interval even while no canary runs, so the first interval of a canary
already has a baseline and yields a real sample instead of an inconclusive one.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import httpx

from folio.operator.analysis import RouterScrapes, prometheus_sample, scrape_routers
from folio.operator.spec import AnalysisSample, AnalysisSpec


class RouterAnalysis:
    def __init__(self, router_url: str, isvc: str) -> None:
        self.metrics_url = f"{router_url}/metrics"
        self.isvc = isvc
        self.scrapes = RouterScrapes(isvc)
        self._client = httpx.AsyncClient(trust_env=False)
        self._next = 0.0  # monotonic time of the next scrape

    async def sample(
        self, *, stable: str | None, canary: str | None, spec: AnalysisSpec
    ) -> AnalysisSample | None:
        """A new sample when an interval has passed and a canary takes traffic; None otherwise."""
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + spec.interval_seconds
        wall = datetime.now(timezone.utc)
        if spec.prometheus is not None:
            if canary is None:
                return None
            return await prometheus_sample(
                self._client, spec.prometheus.url, self.isvc, canary, stable, spec, wall
            )
        texts, notes = await scrape_routers(self._client, [self.metrics_url])
        if canary is None:
            self.scrapes.ingest(texts)  # keeps the baseline current
            return None
        return self.scrapes.sample(texts, canary, stable, spec, wall, notes)

    async def aclose(self) -> None:
        await self._client.aclose()
