"""The tensor-parallel process group of one engine replica, and its timed collectives.

Two groups over the same ranks: the device group carries the model's all-reduces and the logit gather
(NCCL on CUDA, gloo on the CPU), and a gloo group on the host carries the collectives health probe, so
a probe never queues behind a step's device work. Every collective notes when it started
(``in_flight``), which the watchdog (`folio.engine.distributed.watchdog`) reads to tell a stall from
work, and how long it took, which feeds ``folio_engine_collective_seconds``.

On CUDA the host does not wait for a collective, so its time is read from CUDA events once the step's
sampling has synchronised (never inside a CUDA graph capture or replay), and a collective stalled on the
device is NCCL's own watchdog's to catch (the group's timeout is the engine's collective timeout).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

Observer = Callable[[str, float], None]  # (operation, seconds)

COLLECTIVE_METRIC = "folio_engine_collective_seconds"
COLLECTIVE_OPS = ("all_reduce", "gather", "probe")
COLLECTIVE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                      2.5, 5.0, 10.0, 30.0)  # fmt: skip


def collective_metrics(registry: CollectorRegistry, model_name: str) -> Observer:
    """``folio_engine_collective_seconds{model_name, op}`` in ``registry``; returns what feeds it."""
    from prometheus_client import Histogram

    hist = Histogram(
        COLLECTIVE_METRIC, "Time rank 0 spent in tensor-parallel collectives (op: all_reduce, gather, probe).",
        ["model_name", "op"], buckets=COLLECTIVE_BUCKETS, registry=registry,
    )  # fmt: skip
    for op in COLLECTIVE_OPS:
        hist.labels(model_name, op)  # exported from the start, so rate() has a baseline
    return lambda op, seconds: hist.labels(model_name, op).observe(seconds)


@dataclass
class InFlight:
    op: str
    since: float  # time.monotonic()


class TensorParallelGroup:
    def __init__(self, rank: int, size: int, device: torch.device, timeout_s: float) -> None:
        self.rank, self.size, self.device = rank, size, device
        self.timeout_s = timeout_s
        self.in_flight: InFlight | None = None  # the collective this process waits in, if any
        self.probe_in_flight: InFlight | None = None
        self.observe: Observer | None = None
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._probe_group: dist.ProcessGroup | None = None

    # --- set-up and tear-down -----------------------------------------------------------------------

    def join(self, store_path: str, peers_alive: Callable[[], str | None] | None = None,
             start_timeout_s: float = 600.0) -> None:  # fmt: skip
        """Join the group through the file store every rank was given (no port to race for).

        Every rank first checks in and waits (up to ``start_timeout_s``: spawning and importing take a
        while on a loaded machine) until all have; only then is the group made, under the collective
        timeout. ``peers_alive`` (rank 0) returns why a peer cannot arrive any more, which ends the wait.
        """
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        store = dist.FileStore(store_path, self.size)
        store.set(f"arrived/{self.rank}", "1")
        keys = [f"arrived/{r}" for r in range(self.size)]
        deadline = time.monotonic() + start_timeout_s
        while not store.check(keys):
            reason = peers_alive() if peers_alive is not None else None
            if reason is not None:
                raise RuntimeError(f"tensor-parallel start-up failed: {reason}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel ranks did not all start within {start_timeout_s:g}s")
            time.sleep(0.05)
        # gloo's own timeout backs up the watchdog, which fires first with the clearer message
        timeout = datetime.timedelta(seconds=self.timeout_s + 5)
        kwargs = {"device_id": self.device} if self.device.type == "cuda" else {}
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.size, timeout=timeout, **kwargs)
        self._probe_group = dist.new_group(backend="gloo", timeout=timeout)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # --- the model's collectives --------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place; returns it."""
        with self._timed("all_reduce"):
            dist.all_reduce(tensor)
        return tensor

    def gather_to_first(self, tensor: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's ``tensor`` (same shape everywhere) on rank 0, in rank order; None elsewhere."""
        parts = [torch.empty_like(tensor) for _ in range(self.size)] if self.rank == 0 else None
        with self._timed("gather"):
            dist.gather(tensor, parts, dst=0)
        return parts

    # --- health -------------------------------------------------------------------------------------

    def probe(self) -> float:
        """One all-reduce of a single value on the host group; returns its seconds. Raises when a rank
        does not take part (gloo's timeout) or the sum is wrong."""
        assert self._probe_group is not None
        one = torch.ones(1)
        start = time.monotonic()
        self.probe_in_flight = InFlight("probe", start)
        try:
            dist.all_reduce(one, group=self._probe_group)
        finally:
            self.probe_in_flight = None
        seconds = time.monotonic() - start
        if int(one.item()) != self.size:
            raise RuntimeError(f"collectives probe summed to {one.item()}, expected {self.size}")
        if self.observe is not None:
            self.observe("probe", seconds)
        return seconds

    def flush_timings(self) -> None:
        """Report the CUDA collectives whose events have completed (call after a synchronising step)."""
        if not self._events or self.observe is None:
            self._events.clear()
            return
        pending = []
        for op, start, end in self._events:
            if end.query():
                self.observe(op, start.elapsed_time(end) / 1000)
            else:
                pending.append((op, start, end))
        self._events = pending[-1024:]

    def _timed(self, op: str) -> _Timed:
        return _Timed(self, op)


class _Timed:
    """Marks a collective in flight for the watchdog and times it (host clock on the CPU, CUDA events)."""

    __slots__ = ("events", "group", "op")

    def __init__(self, group: TensorParallelGroup, op: str) -> None:
        self.group, self.op = group, op
        self.events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    def __enter__(self) -> None:
        g = self.group
        g.in_flight = InFlight(self.op, time.monotonic())
        if g.device.type == "cuda" and g.observe is not None and not torch.cuda.is_current_stream_capturing():
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self.events[0].record()

    def __exit__(self, *exc: object) -> None:
        g = self.group
        started = g.in_flight
        g.in_flight = None
        if self.events is not None:
            self.events[1].record()
            g._events.append((self.op, *self.events))
        elif g.device.type != "cuda" and g.observe is not None and started is not None and exc[0] is None:
            g.observe(self.op, time.monotonic() - started.since)
