"""The watchdog of a tensor-parallel rank: a thread that fires once when a check finds the group broken.

A check returns why the group is broken (a rank's process gone, a collective waiting past the timeout)
or None. Checks only read state that the collectives and the processes keep; the thread never takes
part in a collective itself, so it sees a stall however the stalled rank is stuck.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from folio.engine.distributed.parallel_state import InFlight, TensorParallelGroup

Check = Callable[[], str | None]
_PERIOD_S = 0.25


class Watchdog:
    def __init__(self, checks: list[Check], on_fire: Callable[[str], None], name: str) -> None:
        self.checks = checks
        self.on_fire = on_fire
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(2 * _PERIOD_S + 1)

    def _run(self) -> None:
        while not self._stop.wait(_PERIOD_S):
            for check in self.checks:
                reason = check()
                if reason is not None:
                    self.on_fire(reason)
                    return


def stalled_collectives(group: TensorParallelGroup) -> Check:
    """Fires when a collective (the model's, or the health probe) has waited longer than the timeout."""

    def check() -> str | None:
        now = time.monotonic()
        for flight in (group.in_flight, group.probe_in_flight):
            if _overdue(flight, now, group.timeout_s):
                assert flight is not None
                return (
                    f"a tensor-parallel {flight.op} on rank {group.rank} has waited {now - flight.since:.1f}s "
                    f"(collective timeout {group.timeout_s:g}s): a rank is stuck or gone"
                )
        return None

    return check


def parent_gone(parent_pid: int) -> Check:
    """Fires when rank 0 (this worker's parent process) has exited."""

    def check() -> str | None:
        return None if os.getppid() == parent_pid else f"rank 0 (pid {parent_pid}) has exited"

    return check


def _overdue(flight: InFlight | None, now: float, timeout_s: float) -> bool:
    return flight is not None and now - flight.since > timeout_s
