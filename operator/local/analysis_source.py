"""Analysis samples for the local runtime: its one router's /metrics (or Prometheus), every interval.

The schedule, the figures and the verdict are `folio.operator.analysis`'s, the code the operator uses.
"""

from __future__ import annotations

import httpx

from folio.operator.analysis import IntervalSampler
from folio.operator.spec import AnalysisSample, AnalysisSpec


class RouterAnalysis:
    def __init__(self, router_url: str, isvc: str) -> None:
        self.metrics_urls = [f"{router_url}/metrics"]
        self.sampler = IntervalSampler(isvc)
        self._client = httpx.AsyncClient(trust_env=False)

    async def sample(
        self, *, stable: str | None, canary: str | None, spec: AnalysisSpec
    ) -> AnalysisSample | None:
        """A new sample when an interval has passed and a canary takes traffic; None otherwise."""

        async def urls() -> list[str]:
            return self.metrics_urls

        if not self.sampler.due(spec):
            return None
        return await self.sampler.take(self._client, urls, canary=canary, stable=stable, spec=spec)

    async def aclose(self) -> None:
        await self._client.aclose()
