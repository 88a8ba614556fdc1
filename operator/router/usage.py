"""Each tenant's usage over the last minute and the last hour, as `folio status NAME --tenants` prints it.

A router keeps, per tenant, a ring of one-second slots for the minute and one of one-minute slots for the
hour, and serves their sums on ``GET /folio/v1/tenants``; `merge` adds up what several routers answer (each
saw its own share of the requests). Prometheus' counters (`folio_router_tenant_*`) hold the same over any
range; these are for a look without a Prometheus.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

FIELDS = ("requests", "rate_limited", "errors", "prompt_tokens", "completion_tokens")
WINDOWS = {"minute": (60, 1.0), "hour": (60, 60.0)}  # name: (slots, seconds a slot)
Counts = dict[str, int]


class Ring:
    """Sums over the last ``slots`` × ``width`` seconds, ``width`` seconds at a time."""

    def __init__(self, slots: int, width: float) -> None:
        self.slots, self.width = slots, width
        self._counts = [[0] * len(FIELDS) for _ in range(slots)]
        self._index = [-1] * slots  # which slot of all time each holds

    def add(self, now: float, values: Iterable[int]) -> None:
        index = math.floor(now / self.width)
        at = index % self.slots
        if self._index[at] != index:
            self._index[at], self._counts[at] = index, [0] * len(FIELDS)
        counts = self._counts[at]
        for i, value in enumerate(values):
            counts[i] += value

    def total(self, now: float) -> Counts:
        newest = math.floor(now / self.width)
        sums = [0] * len(FIELDS)
        for index, counts in zip(self._index, self._counts, strict=True):
            if newest - self.slots < index <= newest:
                sums = [a + b for a, b in zip(sums, counts, strict=True)]
        return dict(zip(FIELDS, sums, strict=True))


class TenantUsage:
    def __init__(self) -> None:
        self._rings: dict[str, dict[str, Ring]] = {}

    def record(self, tenant: str, code: str, prompt_tokens: int, completion_tokens: int, now: float) -> None:
        """One answer to ``tenant``: its HTTP status ``code`` and the tokens it used."""
        rings = self._rings.get(tenant)
        if rings is None:
            rings = self._rings[tenant] = {name: Ring(*shape) for name, shape in WINDOWS.items()}
        ok = code.startswith("2")
        values = (1, int(code == "429"), int(not ok and code != "429"), prompt_tokens, completion_tokens)
        for ring in rings.values():
            ring.add(now, values)

    def snapshot(self, now: float) -> dict[str, dict[str, Counts]]:
        return {tenant: {name: ring.total(now) for name, ring in rings.items()}
                for tenant, rings in sorted(self._rings.items())}  # fmt: skip


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
