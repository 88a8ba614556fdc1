"""Outlier detection with Envoy's semantics: eject a replica after consecutive failures, readmit half-open.

- `consecutive_errors` failures in a row (5xx answers, connection failures, timeouts) eject a replica
  for `base_ejection_time × times ejected`, capped at `MAX_EJECTION_TIME`;
- never more than `max_ejection_percent` of a revision's replicas are ejected at once (rounded down, so
  a lone replica is never ejected);
- when the time is up the replica is half-open: one request goes through; a success readmits it, a
  failure ejects it again at once, for longer.
- 429, and 503 with Retry-After, are load, not failure: `is_failure` says so, and they neither count nor
  reset the streak.

The detector is pure bookkeeping over an injected clock; the balancer asks `usable`, the proxy reports
each attempt's outcome with `record`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass

from folio.operator.spec import OutlierDetectionSpec

MAX_EJECTION_TIME = 300.0  # seconds; Envoy's max_ejection_time default


OutlierDetection = OutlierDetectionSpec  # the router config carries the spec's object as it is


def is_failure(status: int | None, retry_after: bool) -> bool:
    """Whether an attempt's outcome counts towards ejection (None: no answer at all, or a timeout)."""
    if status is None:
        return True
    if status == 429 or (status == 503 and retry_after):
        return False  # load shedding: the replica is healthy, only busy
    return status >= 500


@dataclass
class _Record:
    streak: int = 0  # consecutive failures
    times_ejected: int = 0
    ejected_until: float | None = None  # None: in rotation
    probing: bool = False  # half-open: the one trial request is out


class OutlierDetector:
    def __init__(self, settings: OutlierDetection | None = None, clock: Callable[[], float] = time.monotonic):
        self.settings = settings or OutlierDetection()
        self._clock = clock
        self._records: dict[Hashable, _Record] = {}
        # called with (replica, ejected) whenever a replica leaves or rejoins rotation
        self.on_change: Callable[[Hashable, bool], None] | None = None

    def configure(self, settings: OutlierDetection) -> None:
        self.settings = settings

    def forget(self, keep: Collection[Hashable]) -> None:
        """Drop the state of replicas that are gone from the endpoint map (an ejected one is reported
        readmitted, so that nothing shows it ejected for good)."""
        for replica, record in self._records.items():
            if replica not in keep and record.ejected_until is not None:
                self._changed(replica, False)
        self._records = {k: r for k, r in self._records.items() if k in keep}

    def ejected(self, replica: Hashable) -> bool:
        record = self._records.get(replica)
        return record is not None and record.ejected_until is not None

    def usable(self, replica: Hashable) -> bool:
        """In rotation, or half-open with no trial request out yet."""
        record = self._records.get(replica)
        if record is None or record.ejected_until is None:
            return True
        return not record.probing and self._clock() >= record.ejected_until

    def started(self, replica: Hashable) -> None:
        """A request goes to `replica`: if it is half-open, this one is its trial."""
        record = self._records.get(replica)
        if record is not None and record.ejected_until is not None:
            assert self._clock() >= record.ejected_until, "an ejected replica got a request before its time"
            record.probing = True

    def record(self, replica: Hashable, failed: bool, pool: Collection[Hashable]) -> bool:
        """Count one outcome of `replica`, one of `pool` (its revision's replicas); True when it ejects."""
        record = self._records.setdefault(replica, _Record())
        if record.ejected_until is not None:  # the half-open trial (or a late answer from before)
            record.probing = False
            if not failed:
                record.ejected_until, record.streak = None, 0
                self._changed(replica, False)
                return False
            return self._eject(replica, record, pool, again=True)
        if not failed:
            record.streak = 0
            return False
        record.streak += 1
        if record.streak < self.settings.consecutive_errors:
            return False
        return self._eject(replica, record, pool, again=False)

    def _eject(self, replica: Hashable, record: _Record, pool: Collection[Hashable], *, again: bool) -> bool:
        if not again:
            others = sum(self.ejected(r) for r in pool if r != replica)
            # Rounded down, unlike Envoy's "at least one": a one-replica canary stays in rotation, so the
            # analysis keeps seeing its failures and rolls it back instead of starving it of traffic.
            limit = len(pool) * self.settings.max_ejection_percent // 100
            if others + 1 > limit:
                return False  # too many out already: keep serving on it, the streak stays
        record.times_ejected += 1
        seconds = min(self.settings.base_ejection_seconds * record.times_ejected, MAX_EJECTION_TIME)
        record.ejected_until = self._clock() + seconds
        record.streak = 0
        if not again:
            self._changed(replica, True)
        return True

    def _changed(self, replica: Hashable, ejected: bool) -> None:
        if self.on_change is not None:
            self.on_change(replica, ejected)
