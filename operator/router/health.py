"""Active health checks: take failing replicas out of rotation and put them back once they answer.

The proxy also takes a replica out at once when a connection to it is refused (passive check);
only a successful check here brings it back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import aiohttp

from folio.operator.router.balancer import Replica

log = logging.getLogger(__name__)


class HealthChecker:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        replicas: Callable[[], Iterable[Replica]],
        *,
        path: str = "/health",
        interval: float = 2.0,
        timeout: float = 2.0,
        fall: int = 2,
    ) -> None:
        self._session = session
        self._replicas = replicas
        self._path = path
        self._interval = interval
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._fall = fall  # consecutive failures before a healthy replica is taken out

    async def run(self) -> None:
        while True:
            await self.check_all(self._replicas())
            await asyncio.sleep(self._interval)

    async def check_all(self, replicas: Iterable[Replica]) -> None:
        await asyncio.gather(*(self.check(r) for r in replicas))

    async def check(self, replica: Replica) -> bool:
        try:
            async with self._session.get(replica.url + self._path, timeout=self._timeout) as resp:
                await resp.read()
                ok, reason = resp.status == 200, f"health check answered {resp.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            ok, reason = False, f"health check failed: {exc!r}"
        if ok:
            if not replica.healthy:
                log.info("replica %s (%s) is back in rotation", replica.url, replica.revision)
            replica.mark_up()
            return True
        replica.failures += 1
        if replica.healthy and replica.failures >= self._fall:
            log.warning("taking replica %s (%s) out of rotation: %s", replica.url, replica.revision, reason)
            replica.mark_down(reason)
        return False
