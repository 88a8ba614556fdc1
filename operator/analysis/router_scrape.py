"""The default analysis source: every router pod's /metrics, as deltas since its previous scrape.

A pod seen for the first time only sets its baseline (its counters hold history of unknown age);
the previous scrapes live in memory only, so after a restart the first interval is a baseline
(Inconclusive), which costs one interval and never a wrong verdict. A growing window's counters
(`growth`) are kept in status instead, so they survive.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

import httpx

from folio.operator.analysis.growth import Window, carry
from folio.operator.analysis.verdict import judge
from folio.operator.analysis.windows import Snapshot, delta, figures_from_windows, merge, parse_router_metrics
from folio.operator.spec import AnalysisSample, AnalysisSpec


class RouterScrapes:
    """Keeps each router pod's previous scrape and turns new scrapes into interval windows."""

    def __init__(self, isvc: str, adapter: str | None = None) -> None:
        self.isvc = isvc
        self.adapter = adapter  # the windows of this adapter's revisions (None: the base revisions')
        self._previous: dict[str, Snapshot] = {}

    def ingest(self, texts: Mapping[str, str]) -> tuple[Snapshot, list[str]]:
        """Window since the previous scrapes, from ``{pod url: metrics text}``; plus notes."""
        windows, notes = [], []
        for url, text in texts.items():
            try:
                current = parse_router_metrics(text, self.isvc, self.adapter)
            except ValueError as exc:
                notes.append(f"unreadable metrics from router {url}: {exc}")
                continue
            previous = self._previous.get(url)
            self._previous[url] = current
            if previous is None:
                notes.append(f"router {url} scraped for the first time (baseline)")
            else:
                windows.append(delta(current, previous))
        # forget pods that are gone so a reused address starts from a fresh baseline
        for url in set(self._previous) - set(texts):
            del self._previous[url]
        return merge(windows), notes

    def sample(
        self, texts: Mapping[str, str], canary: str, stable: str | None, spec: AnalysisSpec, now: datetime,
        notes: Sequence[str] = (), window: Window | None = None,
    ) -> AnalysisSample:
        """`judge` on the canary's window since the previous scrapes, added to the counters ``window`` carries
        when it grows (`growth`); an Inconclusive sample keeps the sum for the next one."""
        interval, more = self.ingest(texts)
        counts = merge([window.carried, interval]) if window is not None else interval
        sample = judge(figures_from_windows(counts, canary, stable), spec, now, [*notes, *more],
                       since=window.since if window else None, grown=window.grown if window else False)
        if sample.verdict == "Inconclusive":
            sample.accumulated = carry(counts, canary, stable)
        return sample


Scraped = tuple[dict[str, str], list[str]]  # {router url: metrics text}, notes on the ones not scraped


async def scrape_routers(client: httpx.AsyncClient, urls: Sequence[str]) -> Scraped:
    """GET every router's /metrics; unreachable ones are left out and named in the notes."""
    texts, notes = {}, []
    for url in urls:
        try:
            resp = await client.get(url, timeout=5.0)
            resp.raise_for_status()
            texts[url] = resp.text
        except httpx.HTTPError as exc:
            notes.append(f"router {url} not scraped: {exc!r}")
    return texts, notes
