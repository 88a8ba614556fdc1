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
from folio.operator.router.polling import ReplicaPoller

log = logging.getLogger(__name__)


class HealthChecker(ReplicaPoller):
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
        super().__init__(session, replicas, path=path, interval=interval, timeout=timeout)
        self._fall = fall  # consecutive failures before a healthy replica is taken out

    async def poll(self, replica: Replica) -> bool:
        """One check; a replica that fails `fall` in a row is taken out, one that passes is put back."""
        try:
            async with self.get(replica) as resp:
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
