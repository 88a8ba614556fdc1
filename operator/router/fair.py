"""The order in which waiting requests go: priorities strictly, and tenants fairly within a priority.

A Critical request goes before any Standard one, a Standard one before any Sheddable one. Within one
priority each tenant has its own first-come-first-served queue, and the tenants take turns by start-time
fair queuing (Goyal et al.'s SFQ, a weighted fair queuing that needs no clock of its own) over the tokens
each request reserves: a request's start tag is the later of the priority's virtual time and its tenant's
previous finish tag, its finish tag that plus its tokens, and the waiting request with the lowest start tag
goes next. Two tenants that flood equally get equal tokens; one that sends a request now and then is not
queued behind a flood. Used by the admission queue of saturated replicas (`admission`) and by the hold
queue of scale from zero (`hold`) alike.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")

PRIORITIES = ("Critical", "Standard", "Sheddable")  # first to last
RANK = {name: rank for rank, name in enumerate(PRIORITIES)}
STANDARD = RANK["Standard"]


class Claim(NamedTuple):
    """Who a request is, for the queues: its tenant, its priority's rank and the tokens it reserves (a tuple:
    one is made for every request)."""

    tenant: str = ""
    rank: int = STANDARD
    cost: int = 1


@dataclass(eq=False)
class _Waiting(Generic[T]):
    item: T
    claim: Claim
    start: float
    order: int  # arrival: breaks ties, and says which is newest


@dataclass
class _Priority(Generic[T]):
    queues: dict[str, deque[_Waiting[T]]] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)  # each tenant's last finish tag
    vtime: float = 0.0
    size: int = 0

    def push(self, waiting: _Waiting[T]) -> None:
        tenant = waiting.claim.tenant
        waiting.start = max(self.vtime, self.finish.get(tenant, 0.0))
        self.finish[tenant] = waiting.start + max(waiting.claim.cost, 1)
        self.queues.setdefault(tenant, deque()).append(waiting)
        self.size += 1

    def next(self) -> _Waiting[T] | None:
        heads = (queue[0] for queue in self.queues.values())
        return min(heads, key=lambda w: (w.start, w.order), default=None)

    def drop(self, waiting: _Waiting[T]) -> None:
        queue = self.queues[waiting.claim.tenant]
        queue.remove(waiting)
        if not queue:
            del self.queues[waiting.claim.tenant]
        self.size -= 1
        if not self.size:  # idle: nobody's past use counts against it any more
            self.finish.clear()
            self.vtime = 0.0


class FairQueue(Generic[T]):
    """Waiting items in the order they go (`pop`), with the newest of the lowest priority to shed first."""

    def __init__(self) -> None:
        self._priorities: list[_Priority[T]] = [_Priority() for _ in PRIORITIES]
        self._where: dict[int, _Waiting[T]] = {}  # id(item) -> its place
        self._arrivals = itertools.count()

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, item: T) -> bool:
        return id(item) in self._where

    def waiting(self, rank: int) -> int:
        """How many of priority ``rank`` wait."""
        return self._priorities[rank].size

    def waiting_ahead(self, rank: int) -> int:
        """How many wait that go before a new request of priority ``rank`` (those of its priority or higher)."""
        return sum(p.size for p in self._priorities[: rank + 1])

    def push(self, item: T, claim: Claim) -> None:
        assert id(item) not in self._where, "queued twice"
        assert 0 <= claim.rank < len(PRIORITIES) and claim.cost >= 0, claim
        waiting = _Waiting(item, claim, 0.0, next(self._arrivals))
        self._priorities[claim.rank].push(waiting)
        self._where[id(item)] = waiting

    def peek(self) -> tuple[T, Claim] | None:
        """The item that goes next, and its claim."""
        for priority in self._priorities:
            head = priority.next()
            if head is not None:
                return head.item, head.claim
        return None

    def pop(self) -> T:
        for priority in self._priorities:
            head = priority.next()
            if head is not None:
                priority.vtime = head.start
                self._drop(head)
                return head.item
        raise IndexError("pop from an empty FairQueue")

    def remove(self, item: T) -> bool:
        """Take ``item`` out (its request timed out or left); False when it was not waiting."""
        waiting = self._where.get(id(item))
        if waiting is None:
            return False
        self._drop(waiting)
        return True

    def victim(self, rank: int) -> T | None:
        """What to shed to make room for a request of priority ``rank``: the newest waiting request of the
        lowest priority below it; None when every waiting request ranks with it or above."""
        for priority in reversed(self._priorities[rank + 1 :]):
            newest = max((q[-1] for q in priority.queues.values()), key=lambda w: w.order, default=None)
            if newest is not None:
                return newest.item
        return None

    def _drop(self, waiting: _Waiting[T]) -> None:
        self._priorities[waiting.claim.rank].drop(waiting)
        del self._where[id(waiting.item)]
