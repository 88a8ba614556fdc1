"""Each replica's own view of its load, scraped from its `/metrics` about once a second.

The router counts only the requests it sent itself; other router replicas (and anything calling an
engine directly) load it too. `vllm:num_requests_running` and `vllm:num_requests_waiting` (what the
engine holds, this router's requests among them) and `vllm:kv_cache_usage_perc` (how full its KV cache
is) say so; the balancer counts what the engine held beyond our own in-flight requests of that moment.
`folio_engine_lora_resident` says which adapters it holds in memory: the balancer prefers those replicas for
an adapter's requests.
A scrape that fails, and one older than `balancer.STALE_AFTER` (the scraper stalled), is not used:
the balancer falls back to in-flight counts alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import aiohttp

from folio.engine.server.metrics import LORA_RESIDENT
from folio.operator.router.balancer import Replica
from folio.operator.router.polling import ReplicaPoller

log = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
_NAMES = (RUNNING, WAITING, KV_USAGE)


def parse_resident(text: str) -> frozenset[str]:
    """The adapters an engine holds in memory (``folio_engine_lora_resident``, by ``lora_name``)."""
    prefix = f'{LORA_RESIDENT}{{lora_name="'
    found = set()
    for line in text.splitlines():
        if line.startswith(prefix):
            name, _, rest = line[len(prefix):].partition('"')
            if rest.startswith("}") and rest[1:].split()[:1] != ["0.0"]:
                found.add(name)
    return frozenset(found)


def parse_load(text: str) -> tuple[int, float] | None:
    """(requests running or waiting, KV usage) from a Prometheus text exposition, summed (requests) or
    maxed (usage) over its label sets; None when the page has none of them (not a Folio or vLLM engine)."""
    requests: float | None = None
    usage: float | None = None
    for line in text.splitlines():
        if not line.startswith(_NAMES):
            continue
        brace = line.find("{")
        if brace != -1:  # name{labels} value [timestamp]; label values may hold spaces
            name, rest = line[:brace], line[line.rfind("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        if name not in _NAMES:
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if value != value:  # NaN
            continue
        if name == KV_USAGE:
            usage = value if usage is None else max(usage, value)
        else:
            requests = (requests or 0.0) + value
    if requests is None and usage is None:
        return None
    return int(requests or 0), min(max(usage or 0.0, 0.0), 1.0)


class LoadScraper(ReplicaPoller):
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
        super().__init__(session, replicas, path=path, interval=interval, timeout=timeout)
        self._clock = clock

    async def poll(self, replica: Replica) -> bool:
        """One scrape; on success the replica's load figures and their time are updated."""
        try:
            async with self.get(replica) as resp:
                text = await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, UnicodeDecodeError) as exc:
            log.debug("load scrape of %s failed: %r", replica.url, exc)
            replica.scraped_at = None  # in-flight only from now on
            return False
        load = parse_load(text) if text is not None else None
        if load is None:
            replica.scraped_at = None
            return False
        replica.engine_requests, replica.kv_usage = load
        replica.resident = parse_resident(text) if text is not None else frozenset()
        replica.ours_at_scrape = replica.in_flight  # the engine's count includes these
        replica.scraped_at = self._clock()
        return True
