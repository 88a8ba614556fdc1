"""Requests held while no replica is ready (a revision scaling up from zero), released at a pace.

Kubernetes Services do not buffer, so without this a service scaled to zero answers its first
requests with errors. With ``holding`` in the config (`spec.autoscaling`), a request that finds no
usable replica waits here instead:

- at most ``maxHeldRequests`` wait, each for at most ``holdTimeout``; past either the request gets
  503 with Retry-After in the OpenAI shape, or goes to the overflow endpoint when one is configured;
- while any wait, the router asks for a scale up: its held-requests gauge (`/metrics`) is the ask,
  which the operator's autoscaler reads every second while a service is at zero and `folio up` at
  every tick (routers hold no write permission on the API); an embedding may also pass an ``ask``
  hook, called at once and again every few seconds while nothing is ready;
- once replicas are ready, held requests go out first come, first served, at most
  ``releasePerReplica`` per ready replica at a time: the next one leaves when one of those is
  answered, so a replica that just loaded its weights takes the backlog at its own rate rather than
  all at once (the thundering herd). Requests arriving meanwhile queue behind the held ones.

With ``spec.access`` held requests go in the order of the admission queue (`fair`): priorities strictly,
tenants fairly within one; and a full hold takes a new request in the place of the newest held one of a
lower priority, which is refused instead (``displaced``), so a Critical request is never refused while a
Sheddable one is held.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from folio.operator.router.fair import Claim, FairQueue
from folio.operator.router.metrics import RouterMetrics
from folio.operator.router.state import RoutingState

log = logging.getLogger(__name__)

R = TypeVar("R")
AskScaleUp = Callable[[], Awaitable[None]]
RETRY_AFTER_S = 5  # told to clients refused here
ASK_EVERY_S = 5.0  # while requests are held and nothing is ready
POLL_S = 0.2  # replicas turn usable through health checks too, not only through a new config


@dataclass(eq=False)
class _Held:
    future: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    released: bool = False
    displaced: bool = False  # refused, for a higher priority's place


class HoldQueue:
    def __init__(self, state: RoutingState, metrics: RouterMetrics, ask: AskScaleUp | None = None, *,
                 ask_every: float = ASK_EVERY_S, poll: float = POLL_S) -> None:
        self.state = state
        self.metrics = metrics
        self._ask = ask
        self._ask_every = ask_every
        self._poll = poll
        self._waiting: FairQueue[_Held] = FairQueue()
        self._released = 0  # released from the hold and not answered yet
        self._asked_at = -float("inf")
        self._tasks: set[asyncio.Task[None]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._gauge = metrics.held.labels(metrics.isvc)
        self._gauge.set(0)

    @property
    def held(self) -> int:
        return len(self._waiting)

    def must_wait(self) -> bool:
        """A new request waits: holding is on and nothing is usable, or others are held already."""
        config = self.state.config
        holding = config.holding
        if holding is None or holding.max_held_requests == 0 or not (config.traffic or config.stable):
            return False
        return bool(self._waiting) or self._usable() == 0

    async def run(self, forward: Callable[[], Awaitable[R]], refuse: Callable[[str], Awaitable[R]],
                  claim: Claim | None = None) -> R:  # fmt: skip
        """Hold the request until it may go, then ``forward()`` it; ``refuse(why)`` past the queue or the timeout.
        ``claim``: its tenant's place in the order (none: a Standard request of nobody's)."""
        holding = self.state.config.holding
        assert holding is not None, "must_wait() said no"
        claim = claim or Claim()
        if len(self._waiting) >= holding.max_held_requests and not self._displace(claim):
            self._outcome("full")
            return await refuse(f"{len(self._waiting)} requests are already held (maxHeldRequests)")
        entry = _Held()
        self._waiting.push(entry, claim)
        self._changed()
        self.pump()
        try:
            try:
                await asyncio.wait_for(entry.future, holding.hold_timeout)
            except asyncio.TimeoutError:
                if not entry.released:
                    self._outcome("timeout")
                    return await refuse(f"no replica became ready within {holding.hold_timeout:g}s (holdTimeout)")
            if entry.displaced:
                self._outcome("full")
                return await refuse("the hold is full and a higher priority took this request's place")
            self._outcome("served")
            return await forward()
        except asyncio.CancelledError:
            if not entry.released:
                self._outcome("gone")
            raise
        finally:
            self._waiting.remove(entry)
            if entry.released:
                self._released -= 1
            self.pump()

    def _displace(self, claim: Claim) -> bool:
        """Refuses the newest held request of a priority lower than ``claim``'s, for its place; False: none."""
        victim = self._waiting.victim(claim.rank)
        if victim is None:
            return False
        self._waiting.remove(victim)
        victim.displaced = True
        victim.future.set_result(None)
        return True

    def pump(self) -> None:
        """Release what the ready replicas can take now (call it when replicas or answers change)."""
        holding = self.state.config.holding
        room = float("inf") if holding is None else holding.release_per_replica * self._usable()
        while self._waiting and self._released < room:
            entry = self._waiting.pop()
            if entry.future.done():  # timed out or cancelled: its request is handled already
                continue
            entry.released = True
            self._released += 1
            entry.future.set_result(None)
        self._changed()

    async def close(self) -> None:
        tasks = [*self._tasks, *([self._poller] if self._poller else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------------------ inside

    def _usable(self) -> int:
        balancer = self.state.balancer
        return sum(balancer.usable(r) for r in balancer.replicas())

    def _outcome(self, outcome: str) -> None:
        self.metrics.held_total.labels(self.metrics.isvc, outcome).inc()

    def _changed(self) -> None:
        self._gauge.set(len(self._waiting))
        if not self._waiting:
            return
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._watch(), name="router-hold")
        if self._ask is not None and self._usable() == 0 and time.monotonic() - self._asked_at >= self._ask_every:
            self._asked_at = time.monotonic()
            task = asyncio.get_running_loop().create_task(self._ask_once())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _ask_once(self) -> None:
        assert self._ask is not None
        try:
            await self._ask()
        except Exception as exc:  # the operator still sees the held gauge at its next scrape
            log.warning("asking for a scale up failed: %s", exc)

    async def _watch(self) -> None:
        while self._waiting:
            await asyncio.sleep(self._poll)
            self.pump()
