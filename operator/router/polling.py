"""Asking every replica one thing on a fixed cadence: the loop that health checks and load scrapes share.

A subclass says what one replica's answer means (`poll`); the loop asks all of them at once, waits
`interval`, and asks again, each request held to `timeout`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import aiohttp

from folio.operator.router.balancer import Replica


class ReplicaPoller:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        replicas: Callable[[], Iterable[Replica]],
        *,
        path: str,
        interval: float,
        timeout: float,
    ) -> None:
        self._session = session
        self._replicas = replicas
        self._path = path
        self._interval = interval
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    async def run(self) -> None:
        while True:
            await self.poll_all(self._replicas())
            await asyncio.sleep(self._interval)

    async def poll_all(self, replicas: Iterable[Replica]) -> None:
        await asyncio.gather(*(self.poll(r) for r in replicas))

    async def poll(self, replica: Replica) -> bool:
        raise NotImplementedError

    def get(self, replica: Replica) -> Any:
        """GET the replica's `path`, to be used as ``async with self.get(replica) as resp``."""
        return self._session.get(replica.url + self._path, timeout=self._timeout)
