"""Rank 0's side of tensor parallelism: starts ranks 1..N-1, sends each step's metadata, watches them.

`LLMEngine` makes one when ``tensor_parallel_size > 1`` and loads its own shard beside the workers'.
Start-up: spawn the workers and join the group; everyone loads its shard; rank 0 sizes the KV cache
(per device: the budget is each device's, the blocks hold each rank's KV heads) and tells the others
the number of blocks, so every rank's block ids mean the same slots.

Failure: a worker that exits, a collective waiting past ``collective_timeout`` (the watchdog) or a
failing health probe fails the group once: a clear log line, the surviving workers killed, then the
failure callbacks (the server turns readiness off, answers what is in flight and exits non-zero) and,
when a server is attached, a hard exit if the process still runs ``HARD_EXIT_AFTER_S`` later (a thread
stuck in a collective must not keep a broken replica alive). The next step raises `RankFailedError`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from folio.engine.config import EngineConfig, ModelConfig
from folio.engine.distributed.errors import RankFailedError
from folio.engine.distributed.parallel_state import TensorParallelGroup, collective_metrics
from folio.engine.distributed.sharding import TensorParallel, check_shardable, local_config
from folio.engine.distributed.step_broadcast import StepEncoder
from folio.engine.distributed.watchdog import Watchdog, stalled_collectives
from folio.engine.distributed.worker import WorkerSpec, worker_main

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from folio.engine.distributed.lora import SlotWrite
    from folio.engine.scheduler import ScheduledSeq

log = logging.getLogger("folio.engine.tp")

HARD_EXIT_AFTER_S = 10.0
PROBE_INTERVAL_S = 5.0
EXIT_NOTICE_S = 2.0  # how long a broken pipe waits for the rank's process to show it exited
_START_TIMEOUT_S = 600.0  # loading a shard of a large model from a slow volume


class TensorParallelExecutor:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype) -> None:
        size = config.tensor_parallel_size
        check_shardable(model_config, size)
        self.size = size
        self.device = _rank_device(config.device, 0, size)
        self.group = TensorParallelGroup(0, size, self.device, config.collective_timeout)
        self.tp = TensorParallel(0, size, self.group)
        self.local_config = local_config(model_config, self.tp)
        self.failure: RankFailedError | None = None
        # per worker: bytes_read, rss (after loading), ready_rss and num_blocks (its KV cache, when ready)
        self.worker_stats: list[dict[str, Any]] = []
        self._on_failure: list[Callable[[RankFailedError], None]] = []
        self._hard_exit = False
        self._lock = threading.Lock()  # one sender at a time, so every worker sees messages in one order
        self._fail_lock = threading.Lock()
        self._closed = False
        self._watching = False
        self._encoder = StepEncoder()
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None
        self._threads_before = torch.get_num_threads()
        threads = max(1, (os.cpu_count() or 1) // size) if self.device.type == "cpu" else self._threads_before
        torch.set_num_threads(threads)  # on the CPU each rank gets its share of the cores

        self._tmp = Path(tempfile.mkdtemp(prefix="folio-tp-"))
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked CUDA context or engine threads
        self.procs: list[mp.process.BaseProcess] = []
        self.conns: list[Connection] = []
        for rank in range(1, size):
            spec = WorkerSpec(
                rank, size, str(self._tmp / "store"), config, model_config, dtype,
                str(_rank_device(config.device, rank, size)), threads, logging.getLogger().getEffectiveLevel(),
            )
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(spec, theirs), name=f"folio-tp-rank{rank}", daemon=True)
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(ours)
        atexit.register(self.close)
        log.info("tensor parallelism: %d ranks on %s (workers: pids %s)", size, self.device,
                 ", ".join(str(p.pid) for p in self.procs))
        try:
            self.group.join(str(self._tmp / "store"), self._check_workers, _START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise
        self._watchdog = Watchdog([self._check_workers, stalled_collectives(self.group)], self.fail, "folio-tp-watchdog")

    # --- start-up -----------------------------------------------------------------------------------

    def start(self, num_blocks: int, *, enforce_eager: bool) -> None:
        """Once rank 0 has loaded its shard and sized the KV cache: wait for the workers' shards and hand
        them the number of blocks. They allocate theirs (and capture decode graphs, whose warm-up meets
        collectives) while rank 0 builds its own runner; `wait_ready` then waits for them."""
        self.worker_stats = [self._reply(r, "loaded") for r in range(1, self.size)]
        self._send(("init", num_blocks, enforce_eager))

    def resize(self, num_blocks: int, *, enforce_eager: bool) -> None:
        """Every worker replaces its KV cache (the profiling step's) with ``num_blocks`` blocks, beside
        rank 0 doing the same; `wait_ready` waits for them."""
        self._send(("resize", num_blocks, enforce_eager))

    def wait_ready(self) -> None:
        """Wait until every worker has its cache; from the first time on, watch the workers."""
        for r in range(1, self.size):
            ready = self._reply(r, "ready")
            self.worker_stats[r - 1] |= {"ready_rss": ready["rss"], "num_blocks": ready["num_blocks"]}
        if not self._watching:
            self._watching = True
            self._watchdog.start()

    def start_probes(self) -> None:
        """Start the collectives health probe, once start-up is over (a probe would queue behind a resize)."""
        self._prober = threading.Thread(target=self._probe_loop, name="folio-tp-probe", daemon=True)
        self._prober.start()

    def _reply(self, rank: int, expected: str) -> dict[str, Any]:
        conn, proc = self.conns[rank - 1], self.procs[rank - 1]
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not conn.poll(0.2):
            if not proc.is_alive():
                raise RuntimeError(f"tensor-parallel rank {rank} exited with code {proc.exitcode} while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel rank {rank} did not start within {_START_TIMEOUT_S:g}s")
        kind, payload = conn.recv()
        if kind == "error":
            raise RuntimeError(f"tensor-parallel rank {rank} failed to start: {payload}")
        assert kind == expected, (kind, expected)
        return payload

    # --- steps --------------------------------------------------------------------------------------

    def broadcast_step(self, batch: list[ScheduledSeq], lora_writes: Sequence[SlotWrite] = ()) -> None:
        """Send the step's metadata to every worker (call right before rank 0 runs it), with the adapter
        slots rank 0 wrote since the last step (`folio.engine.distributed.lora`)."""
        self.raise_if_failed()
        self.group.flush_timings()
        self._send(("step", self._encoder.encode(batch), list(lora_writes)))

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise self.failure

    def failure_after(self, wait_s: float) -> RankFailedError | None:
        """The group's failure, given the watchdog ``wait_s`` to notice one first (a collective that
        just raised may have lost a rank the watchdog has not seen yet)."""
        deadline = time.monotonic() + wait_s
        while self.failure is None and time.monotonic() < deadline and not self._closed:
            self._check_and_fail()
            time.sleep(0.05)
        return self.failure

    def _send(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            for rank, conn in enumerate(self.conns, start=1):
                try:
                    conn.send_bytes(data)
                except OSError as exc:
                    self.fail(self._exited_rank() or f"tensor-parallel rank {rank} cannot be reached ({exc})")
                    raise self.failure from exc  # type: ignore[misc]

    # --- health -------------------------------------------------------------------------------------

    def _probe_loop(self) -> None:
        while not self._stop.wait(PROBE_INTERVAL_S):
            if self.failure is not None:
                return
            try:
                with self._lock:
                    if self._stop.is_set():  # close() has sent, or is about to send, "stop"
                        return
                    for conn in self.conns:
                        conn.send_bytes(pickle.dumps(("probe",)))
                self.group.probe()
            except Exception as exc:
                if not self._stop.is_set():
                    self.fail(self._exited_rank() or f"the collectives health probe failed: {exc}")
                return

    def _exited_rank(self, wait_s: float = EXIT_NOTICE_S) -> str | None:
        """The line naming a rank that exited and its exit code, waiting up to ``wait_s`` for one: a broken
        pipe or collective is most often a rank that died, and its process is reaped a moment later."""
        deadline = time.monotonic() + wait_s
        while (reason := self._check_workers()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return reason

    def _check_workers(self) -> str | None:
        for rank, proc in enumerate(self.procs, start=1):
            if not proc.is_alive():
                return f"tensor-parallel rank {rank} (pid {proc.pid}) exited with code {proc.exitcode}"
        return None

    def _check_and_fail(self) -> None:
        reason = self._check_workers()
        if reason is not None:
            self.fail(reason)

    def fail(self, reason: str) -> None:
        with self._fail_lock:
            if self.failure is not None or self._closed:
                return
            self.failure = RankFailedError(reason)
        log.critical("%s; taking this engine replica down", reason)
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
        for callback in self._on_failure:
            try:
                callback(self.failure)
            except Exception:
                log.exception("a tensor-parallel failure callback raised")
        if self._hard_exit:
            threading.Thread(target=_exit_later, name="folio-tp-exit", daemon=True).start()

    # --- the server -------------------------------------------------------------------------------

    def attach(
        self, on_failure: Callable[[RankFailedError], None], registry: CollectorRegistry, model_name: str
    ) -> None:
        """Serve mode: export ``folio_engine_collective_seconds``, call ``on_failure`` when the group
        fails, and exit the process if it has not within HARD_EXIT_AFTER_S after."""
        self.group.observe = collective_metrics(registry, model_name)
        self._on_failure.append(on_failure)
        self._hard_exit = True

    # --- shutdown ---------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if hasattr(self, "_watchdog"):
            self._watchdog.stop()
        with self._lock:  # after any probe already sent: the workers answer it, then stop
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.send_bytes(pickle.dumps(("stop",)))
        if self._prober is not None:
            self._prober.join(5)
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for conn in self.conns:
            conn.close()
        if self.failure is None:
            self.group.close()  # after a failure a peer is gone: tearing the group down could block
        torch.set_num_threads(self._threads_before)
        shutil.rmtree(self._tmp, ignore_errors=True)
        atexit.unregister(self.close)


def _exit_later() -> None:
    time.sleep(HARD_EXIT_AFTER_S)
    log.critical("still running %gs after the tensor-parallel group failed; exiting now", HARD_EXIT_AFTER_S)
    logging.shutdown()
    os._exit(1)


def _rank_device(device: str, rank: int, size: int) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available")
    if torch.cuda.device_count() < size:
        raise ValueError(f"tensor_parallel_size {size} needs {size} CUDA devices; this machine has "
                         f"{torch.cuda.device_count()}")
    return torch.device("cuda", rank)
