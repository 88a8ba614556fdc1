"""The process group of one engine replica, and its timed collectives.

The world is T × P ranks (`folio.engine.distributed.pipeline.Layout`; P = 1 without pipeline
parallelism). The device group carries the model's all-reduces and the logit gather inside a stage's
tensor-parallel group, and the stages' point-to-point transfers (NCCL on CUDA, gloo on the CPU); a gloo
group over the whole world on the host carries the collectives health probe, so a probe never queues
behind a step's device work. Every collective notes when it started
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

from folio.engine.distributed.pipeline import Layout

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

Observer = Callable[[str, float], None]  # (operation, seconds)

COLLECTIVE_METRIC = "folio_engine_collective_seconds"
COLLECTIVE_OPS = ("all_reduce", "gather", "send", "recv", "probe")
COLLECTIVE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                      2.5, 5.0, 10.0, 30.0)  # fmt: skip


def collective_metrics(registry: CollectorRegistry, model_name: str) -> Observer:
    """``folio_engine_collective_seconds{model_name, op}`` in ``registry``; returns what feeds it."""
    from prometheus_client import Histogram

    hist = Histogram(
        COLLECTIVE_METRIC, "Time rank 0 spent in collectives (op: all_reduce, gather, send, recv, probe).",
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
    """``rank`` and ``size``: this process's place in its stage's tensor-parallel group; ``global_rank`` in
    the world of ``layout``."""

    def __init__(self, global_rank: int, layout: Layout, device: torch.device, timeout_s: float) -> None:
        self.global_rank, self.layout, self.device = global_rank, layout, device
        self.rank, self.size = layout.tp_rank(global_rank), layout.tp_size
        self.world_size = layout.world_size
        self._tp_group: dist.ProcessGroup | None = None  # None: the world is one stage
        self._tp_first = layout.rank(layout.stage(global_rank), 0)
        self.timeout_s = timeout_s
        self.in_flight: InFlight | None = None  # the collective this process waits in, if any
        self.probe_in_flight: InFlight | None = None
        self.observe: Observer | None = None
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._probe_group: dist.ProcessGroup | None = None

    # --- set-up and tear-down -----------------------------------------------------------------------

    def join(self, store_address: str, peers_alive: Callable[[], str | None] | None = None,
             start_timeout_s: float = 600.0) -> None:  # fmt: skip
        """Join the group through the store every rank was given: a file (ranks on one machine: no port to
        race for) or ``tcp://HOST:PORT`` (ranks on several nodes; rank 0 serves it, the others retry until it
        listens).

        Every rank first checks in and waits (up to ``start_timeout_s``: spawning, importing and scheduling
        the other pods take a while) until all have; only then is the group made, under the collective
        timeout. ``peers_alive`` (rank 0) returns why a peer cannot arrive any more, which ends the wait.
        """
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        store = _store(store_address, self.global_rank, self.world_size, start_timeout_s)
        store.set(f"arrived/{self.global_rank}", "1")
        keys = [f"arrived/{r}" for r in range(self.world_size)]
        deadline = time.monotonic() + start_timeout_s
        while not store.check(keys):
            reason = peers_alive() if peers_alive is not None else None
            if reason is not None:
                raise RuntimeError(f"parallel start-up failed: {reason}")
            if time.monotonic() > deadline:
                missing = [r for r in range(self.world_size) if not store.check([f"arrived/{r}"])]
                raise RuntimeError(f"ranks {missing} of {self.world_size} did not arrive within {start_timeout_s:g}s")
            time.sleep(0.05)
        # gloo's own timeout backs up the watchdog, which fires first with the clearer message
        timeout = datetime.timedelta(seconds=self.timeout_s + 5)
        kwargs = {"device_id": self.device} if self.device.type == "cuda" else {}
        dist.init_process_group(backend, store=store, rank=self.global_rank, world_size=self.world_size,
                                timeout=timeout, **kwargs)  # fmt: skip
        if self.layout.pp_size > 1:  # every rank makes every stage's group, in one order
            for stage in range(self.layout.pp_size):
                group = dist.new_group(self.layout.stage_ranks(stage), timeout=timeout)
                if stage == self.layout.stage(self.global_rank):
                    self._tp_group = group
        self._probe_group = dist.new_group(backend="gloo", timeout=timeout)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # --- the model's collectives --------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place; returns it."""
        with self.timed("all_reduce"):
            dist.all_reduce(tensor, group=self._tp_group)
        return tensor

    def gather_to_first(self, tensor: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's ``tensor`` (same shape everywhere) on the group's rank 0, in rank order; None elsewhere."""
        parts = [torch.empty_like(tensor) for _ in range(self.size)] if self.rank == 0 else None
        with self.timed("gather"):
            dist.gather(tensor, parts, dst=self._tp_first, group=self._tp_group)
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
        if int(one.item()) != self.world_size:
            raise RuntimeError(f"collectives probe summed to {one.item()}, expected {self.world_size}")
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

    def timed(self, op: str) -> _Timed:
        """Marks a collective or transfer in flight (for the watchdog) and times it."""
        return _Timed(self, op)


def _store(address: str, rank: int, world_size: int, timeout_s: float) -> dist.Store:
    timeout = datetime.timedelta(seconds=timeout_s)
    if not address.startswith("tcp://"):
        return dist.FileStore(address, world_size)
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    # a worker's client retries connecting until rank 0 listens (pods of a group start in any order)
    return dist.TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False)


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
