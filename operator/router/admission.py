"""Tenants' requests while the replicas are saturated: they wait in the router, fairly, by priority.

With ``spec.access`` a router admits at most what its revisions' replicas can run at once: each usable
replica has ``slots`` (its engine's ``--max-num-seqs``), less what its engine holds for other callers (other
routers: `loadscrape`). Past that, a request waits here in its tenant's queue (`fair.FairQueue`: priorities
strictly, tenants by fair queuing within one) and goes when an admitted request ends. Each priority counts
the ones below it as room: the engines run ``--scheduling-policy priority``, where a request preempts a
lower one for its place, so a Critical request waits only for Critical ones, and a Standard one only for
Standard and Critical ones.

The queue is bounded, and what does not fit is shed with 503 and Retry-After (never left to time out):

- Sheddable requests wait at most as many as the replicas run at once (about one answer's time); more of
  them are shed at once;
- when the queue is full (``QUEUE_LIMIT``), a new request takes the place of the newest waiting one of a
  lower priority, which is shed ("displaced"): a Critical request is never shed while a Sheddable one waits;
  with none lower, the new one is shed itself ("full");
- a request waits at most ``QUEUE_TIMEOUT_S``, then it is shed ("timeout").

Shed requests never reach a revision, so they count in no analysed counter: `folio_router_tenant_shed_total`
counts them, by tenant and why. `folio_router_tenant_queue_seconds` is every admitted request's wait.
With no usable replica at all (scale from zero) nothing waits here: the hold queue (`hold`) holds them, by
the same rules.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from folio.operator.router.fair import PRIORITIES, RANK, Claim, FairQueue
from folio.operator.router.metrics import RouterMetrics
from folio.operator.router.state import RoutingState

QUEUE_LIMIT = 1024  # requests waiting, all tenants together
QUEUE_TIMEOUT_S = 60.0
RETRY_AFTER_S = 1  # told to shed requests: the queue turns over within about an answer's time
POLL_S = 0.2  # replicas turn usable (and scrapes change their room) without any request ending
CAPACITY_TTL_S = 0.05
SHEDDABLE = RANK["Sheddable"]


class Shed(Exception):
    """A request the queue could not keep: 503, Retry-After ``RETRY_AFTER_S``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(eq=False, slots=True)
class Ticket:
    """An admitted (or waiting) request's place."""

    claim: Claim
    since: float = 0.0  # when it began to wait (`time.monotonic`)
    future: asyncio.Future[None] | None = None
    admitted: bool = False
    shed: Shed | None = None


class Admission:
    def __init__(self, state: RoutingState, metrics: RouterMetrics, *, limit: int = QUEUE_LIMIT,
                 timeout: float = QUEUE_TIMEOUT_S, poll: float = POLL_S) -> None:  # fmt: skip
        self.state = state
        self.metrics = metrics
        self._limit = limit
        self._timeout = timeout
        self._poll = poll
        self._queue: FairQueue[Ticket] = FairQueue()
        self._running = [0] * len(PRIORITIES)  # admitted and not ended, by priority
        self._poller: asyncio.Task[None] | None = None
        self._capacity: int | None = None
        self._capacity_at = -float("inf")

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def running(self, rank: int) -> int:
        return self._running[rank]

    def capacity(self) -> int | None:
        """Requests the usable replicas can run at once for this router; None: no usable replica, or no
        slots known (the config has no access)."""
        access = self.state.config.access
        if access is None:
            return None
        balancer = self.state.balancer
        now = time.monotonic()
        total, usable = 0, False
        for replica in balancer.replicas():
            if not balancer.usable(replica):
                continue
            usable = True
            foreign = max(0, replica.engine_requests - replica.ours_at_scrape) if balancer.fresh(replica, now) else 0
            total += max(0, access.slots - foreign)
        return total if usable else None

    def has_room(self, rank: int, capacity: int | None) -> bool:
        """Whether a request of priority ``rank`` may run now: those of its priority and higher leave room."""
        return capacity is None or sum(self._running[: rank + 1]) < capacity

    def try_enter(self, claim: Claim) -> Ticket | None:
        """The request's ticket if it may go at once (give it to `leave` once its answer ends); None: it
        must `enter` and wait."""
        if (self._queue and self._queue.waiting_ahead(claim.rank)) or not self.has_room(
            claim.rank, self._recent_capacity()
        ):
            return None
        ticket = Ticket(claim)
        self._admit(ticket, 0.0)
        return ticket

    async def enter(self, claim: Claim) -> Ticket:
        """Wait for the request's turn; returns its ticket (give it to `leave` once its answer ends), or
        raises `Shed`."""
        at_once = self.try_enter(claim)
        if at_once is not None:
            return at_once
        ticket = Ticket(claim, since=time.monotonic())
        self._make_room(ticket, self._recent_capacity())
        ticket.future = asyncio.get_running_loop().create_future()
        self._queue.push(ticket, claim)
        self._watch()
        try:
            async with asyncio.timeout(self._timeout):
                await ticket.future
        except TimeoutError:
            pass
        except BaseException:  # the client left: a place it was just given goes to the next
            self.leave(ticket)
            raise
        finally:
            if self._queue.remove(ticket):  # timed out, or the client left
                self._pump()
        if ticket.shed is not None:
            raise ticket.shed
        if not ticket.admitted:
            raise self._shed(ticket, "timeout", f"waited {self._timeout:g}s for a saturated service")
        return ticket

    def leave(self, ticket: Ticket) -> None:
        if ticket.admitted:
            ticket.admitted = False
            self._running[ticket.claim.rank] -= 1
            assert self._running[ticket.claim.rank] >= 0
            if self._queue:
                self._pump()

    def pump(self) -> None:
        """Admit what the replicas can take now (call it when replicas change)."""
        self._capacity_at = -float("inf")
        self._pump()

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)

    # ------------------------------------------------------------------------------ inside

    def _recent_capacity(self) -> int | None:
        """`capacity`, computed at most every ``CAPACITY_TTL_S``: what changes it (health, ejections, the
        scrapes of other routers' load) changes at that pace or slower, and each request need not add it up."""
        now = time.monotonic()
        if now - self._capacity_at >= CAPACITY_TTL_S:
            self._capacity, self._capacity_at = self.capacity(), now
        return self._capacity

    def _admit(self, ticket: Ticket, waited: float) -> None:
        ticket.admitted = True
        self._running[ticket.claim.rank] += 1
        self.metrics.tenants.queued(ticket.claim.tenant, waited)

    def _make_room(self, ticket: Ticket, capacity: int | None) -> None:
        """Sheds what must go for ``ticket`` to wait: a Sheddable one past its depth, a lower one when full."""
        rank = ticket.claim.rank
        if rank == SHEDDABLE and self._queue.waiting(SHEDDABLE) >= max(1, capacity or 0):
            raise self._shed(ticket, "full", "the replicas are saturated and Sheddable requests wait no deeper")
        if len(self._queue) < self._limit:
            return
        victim = self._queue.victim(rank)
        if victim is None:
            raise self._shed(ticket, "full", f"the replicas are saturated and {len(self._queue)} requests wait")
        self._queue.remove(victim)
        assert victim.future is not None
        victim.shed = self._shed(victim, "displaced", "the replicas are saturated and a higher priority took its place")
        victim.future.set_result(None)

    def _shed(self, ticket: Ticket, reason: str, why: str) -> Shed:
        self.metrics.tenants.shed(ticket.claim.tenant, reason)
        return Shed(reason, f"{why}; retry after {RETRY_AFTER_S}s")

    def _pump(self) -> None:
        capacity = self._recent_capacity()
        while (head := self._queue.peek()) is not None and self.has_room(head[1].rank, capacity):
            ticket = self._queue.pop()
            self._admit(ticket, time.monotonic() - ticket.since)
            assert ticket.future is not None
            ticket.future.set_result(None)

    def _watch(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll_room(), name="router-admission")

    async def _poll_room(self) -> None:
        while len(self._queue):
            await asyncio.sleep(self._poll)
            self._pump()
