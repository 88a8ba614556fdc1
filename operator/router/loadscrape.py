"""Each replica's own view of its load, scraped from its `/metrics` about once a second.

The router counts only the requests it sent itself; other router replicas (and anything calling an
engine directly) load it too. `vllm:num_requests_waiting` (queued on the engine) and
`vllm:kv_cache_usage_perc` (how full its KV cache is) say so.
A scrape that fails, and one older than `balancer.STALE_AFTER` (the scraper stalled), is not used:
the balancer falls back to in-flight counts alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp

from folio.operator.router.balancer import Replica

log = logging.getLogger(__name__)

WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"


def parse_load(text: str) -> tuple[int, float] | None:
    """(waiting, KV usage) from a Prometheus text exposition, summed (waiting) or maxed (usage) over its
    label sets; None when the page has neither (not a Folio or vLLM engine)."""
    waiting: float | None = None
    usage: float | None = None
    for line in text.splitlines():
        if not line.startswith((WAITING, KV_USAGE)):
            continue
        brace = line.find("{")
        if brace != -1:  # name{labels} value [timestamp]; label values may hold spaces
            name, rest = line[:brace], line[line.rfind("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        if name not in (WAITING, KV_USAGE):
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if value != value:  # NaN
            continue
        if name == WAITING:
            waiting = (waiting or 0.0) + value
        else:
            usage = value if usage is None else max(usage, value)
    if waiting is None and usage is None:
        return None
    return int(waiting or 0), min(max(usage or 0.0, 0.0), 1.0)


class LoadScraper:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        replicas: Callable[[], Iterable[Replica]],
        *,
        path: str = "/metrics",
        interval: float = 1.0,
        timeout: float = 0.8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._session = session
        self._replicas = replicas
        self._path = path
        self._interval = interval
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._clock = clock

    async def run(self) -> None:
        while True:
            await self.scrape_all(self._replicas())
            await asyncio.sleep(self._interval)

    async def scrape_all(self, replicas: Iterable[Replica]) -> None:
        await asyncio.gather(*(self.scrape(r) for r in replicas))

    async def scrape(self, replica: Replica) -> bool:
        """One scrape; on success the replica's load figures and their time are updated."""
        try:
            async with self._session.get(replica.url + self._path, timeout=self._timeout) as resp:
                text = await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, UnicodeDecodeError) as exc:
            log.debug("load scrape of %s failed: %r", replica.url, exc)
            replica.scraped_at = None  # in-flight only from now on
            return False
        load = parse_load(text) if text is not None else None
        if load is None:
            replica.scraped_at = None
            return False
        replica.waiting, replica.kv_usage = load
        replica.scraped_at = self._clock()
        return True
