"""Each tenant's counts: all time, for Prometheus (`folio_router_tenant_*`, rendered at scrape time by
`folio.operator.router.metrics`), and over the last minute and the last hour, as `folio status NAME --tenants`
prints them (``GET /folio/v1/tenants``; `merge` adds up what several routers answer, each having seen its
own share of the requests).

Every tenant's request updates these, so an update is a few additions to plain numbers of one `Ledger`:
no lock, no label lookup, nothing a scrape or a snapshot can compute later instead. The minute is a ring
of one-second slots; a second, once over, is added into the hour's ring of one-minute slots.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence

FIELDS = ("requests", "rate_limited", "errors", "prompt_tokens", "completion_tokens")
WINDOWS = {"minute": (60, 1.0), "hour": (60, 60.0)}  # name: (slots, seconds a slot)
Counts = dict[str, int]


class Ring:
    """Sums over the last ``slots`` × ``width`` seconds, ``width`` seconds at a time."""

    def __init__(self, slots: int, width: float) -> None:
        self.slots, self.width = slots, width
        self._counts = [[0] * len(FIELDS) for _ in range(slots)]
        self._index = [-1] * slots  # which slot of all time each holds

    def slot(self, index: int) -> list[int]:
        """The counts of slot ``index`` (of all time, ``width`` seconds each), to add to: emptied if it held
        an older one's."""
        at = index % self.slots
        if self._index[at] != index:
            self._index[at], self._counts[at] = index, [0] * len(FIELDS)
        return self._counts[at]

    def add(self, now: float, values: Sequence[int]) -> None:
        counts = self.slot(math.floor(now / self.width))
        for i, value in enumerate(values):
            counts[i] += value

    def holds(self, index: int, now: float) -> bool:
        """Whether slot ``index`` is within the window ending ``now``."""
        newest = math.floor(now / self.width)
        return newest - self.slots < index <= newest

    def sums(self, now: float) -> list[int]:
        sums = [0] * len(FIELDS)
        for index, counts in zip(self._index, self._counts, strict=True):
            if self.holds(index, now):
                sums = [a + b for a, b in zip(sums, counts, strict=True)]
        return sums

    def total(self, now: float) -> Counts:
        return dict(zip(FIELDS, self.sums(now), strict=True))


class Ledger:
    """One tenant's counts in one router."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.codes: dict[str, int] = {}  # answers by HTTP status
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.queue_counts = [0] * (len(buckets) + 1)  # waits by histogram bucket (not cumulative); last: +Inf
        self.queue_sum = 0.0
        self.shed: dict[str, int] = {}  # by reason
        self.minute = Ring(*WINDOWS["minute"])
        self.hour = Ring(*WINDOWS["hour"])
        self._second = -1  # the second `_now` counts, not yet added into `hour`
        self._now = [0] * len(FIELDS)

    def answered(self, code: str, prompt_tokens: int, completion_tokens: int, now: float) -> None:
        self.codes[code] = self.codes.get(code, 0) + 1
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        second = math.floor(now)
        if second != self._second:
            self._turn(second)
        counts = self._now
        counts[0] += 1
        if code[0] != "2":
            counts[1 if code == "429" else 2] += 1
        counts[3] += prompt_tokens
        counts[4] += completion_tokens

    def _turn(self, second: int) -> None:
        """A new second: the last one's counts join the hour, and the minute gets a fresh slot."""
        if self._second >= 0:
            self.hour.add(self._second, self._now)
        self._second = second
        self._now = self.minute.slot(second)

    def windows(self, now: float) -> dict[str, Counts]:
        hour = self.hour.sums(now)
        if self._second >= 0 and self.hour.holds(math.floor(self._second / self.hour.width), now):  # (not in it yet)
            hour = [a + b for a, b in zip(hour, self._now, strict=True)]
        return {"minute": self.minute.total(now), "hour": dict(zip(FIELDS, hour, strict=True))}


class TenantUsage:
    """Every tenant's `Ledger` (the tenants are the Secret's keys: a bounded set, kept for good)."""

    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)  # the queue wait's histogram's upper bounds
        self.ledgers: dict[str, Ledger] = {}

    def ledger(self, tenant: str) -> Ledger:
        ledger = self.ledgers.get(tenant)
        if ledger is None:
            ledger = self.ledgers[tenant] = Ledger(self.buckets)
        return ledger

    def record(self, tenant: str, code: str, prompt_tokens: int, completion_tokens: int, now: float) -> None:
        """One answer to ``tenant``: its HTTP status ``code`` and the tokens it used."""
        self.ledger(tenant).answered(code, prompt_tokens, completion_tokens, now)

    def queued(self, tenant: str, seconds: float) -> None:
        """An admitted request of ``tenant`` waited ``seconds`` for its turn (0: none)."""
        ledger = self.ledger(tenant)
        ledger.queue_counts[bisect_left(self.buckets, seconds) if seconds else 0] += 1
        ledger.queue_sum += seconds

    def shed(self, tenant: str, reason: str) -> None:
        shed = self.ledger(tenant).shed
        shed[reason] = shed.get(reason, 0) + 1

    def snapshot(self, now: float) -> dict[str, dict[str, Counts]]:
        return {tenant: ledger.windows(now) for tenant, ledger in sorted(self.ledgers.items())}


def merge(snapshots: Iterable[Mapping[str, Mapping[str, Mapping[str, int]]]]) -> dict[str, dict[str, Counts]]:
    """Several routers' snapshots added up."""
    out: dict[str, dict[str, Counts]] = {}
    for snapshot in snapshots:
        for tenant, windows in snapshot.items():
            mine = out.setdefault(tenant, {name: dict.fromkeys(FIELDS, 0) for name in WINDOWS})
            for name in WINDOWS:
                for key in FIELDS:
                    mine[name][key] += int((windows.get(name) or {}).get(key, 0))
    return dict(sorted(out.items()))
