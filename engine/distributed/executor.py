"""Rank 0's side of tensor and pipeline parallelism: starts ranks 1..N-1, sends each step's metadata,
watches them.

`LLMEngine` makes one when ``tensor_parallel_size × pipeline_parallel_size > 1`` and loads its own part
beside the workers' (`folio.engine.distributed.pipeline` lays the ranks out). Start-up: spawn the workers
and join the group; everyone loads its part; rank 0 sizes the KV cache (per device: the budget is each
device's, the blocks hold each rank's KV heads of the largest stage's layers) and tells the others the
number of blocks, so every rank's block ids mean the same slots. With pipeline stages, a step's sampling
comes later than its forward (`finish_step`): stage 0's other tensor-parallel ranks are told when, to
join the logits' gather.

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
from folio.engine.distributed import nodes
from folio.engine.distributed.errors import RankFailedError
from folio.engine.distributed.parallel_state import TensorParallelGroup, collective_metrics
from folio.engine.distributed.pipeline import Layout, StageLink, check_pipelinable, stage_config, stage_layers
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
TEARDOWN_WAIT_S = 5.0  # a failed group's teardown, before close() gives up on it (the next engine then cannot start)
EXIT_NOTICE_S = 2.0  # how long a broken pipe waits for the rank's process to show it exited
_START_TIMEOUT_S = 600.0  # loading a shard of a large model from a slow volume


class TensorParallelExecutor:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype) -> None:
        layout = Layout(config.tensor_parallel_size, config.pipeline_parallel_size)
        if layout.tp_size > 1:
            check_shardable(model_config, layout.tp_size)
        check_pipelinable(model_config, layout.pp_size)
        self.layout = layout
        self.size = size = layout.world_size
        local = nodes.node_ranks(config)  # node 0's ranks: rank 0 and the workers it spawns
        self.device = rank_device(config.device, 0, len(local))
        self.group = TensorParallelGroup(0, layout, self.device, config.collective_timeout)
        self.tp = TensorParallel(0, layout.tp_size, self.group) if layout.tp_size > 1 else None
        tp_config = model_config if self.tp is None else local_config(model_config, self.tp)
        # rank 0's layers (all of them without stages), and the facts its KV cache is made of
        self.layers = stage_layers(model_config, layout.pp_size, 0)
        self.local_config = stage_config(tp_config, self.layers)
        # every rank's cache has the same number of blocks: the budget must hold the largest stage's
        largest = max((stage_layers(model_config, layout.pp_size, s) for s in range(layout.pp_size)), key=len)
        self.sizing_config = stage_config(tp_config, largest)
        self.link = None if layout.pp_size == 1 else StageLink(
            layout, 0, self.group, model_config.hidden_size, dtype, self.device)
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
        threads = max(1, (os.cpu_count() or 1) // len(local)) if self.device.type == "cpu" else self._threads_before
        torch.set_num_threads(threads)  # on the CPU each rank gets its share of the cores

        self._tmp = Path(tempfile.mkdtemp(prefix="folio-tp-"))
        store = str(self._tmp / "store") if config.nnodes == 1 else nodes.store_address(config)
        # the other nodes' ranks connect to rank 0's step channel (`folio.engine.distributed.nodes`)
        self.remote = range(local.stop, size)
        listener = nodes.StepListener(config, self.remote) if config.nnodes > 1 else None
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked CUDA context or engine threads
        self.procs: list[mp.process.BaseProcess] = []  # this node's workers (ranks 1 .. len(local) - 1)
        self.conns: list[Connection] = []  # every worker's, by rank (the other nodes' added once they join)
        for rank in local[1:]:
            spec = WorkerSpec(
                rank, layout, store, config, model_config, dtype,
                str(rank_device(config.device, rank, len(local))), threads, logging.getLogger().getEffectiveLevel(),
            )
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(spec, theirs), name=f"folio-tp-rank{rank}", daemon=True)
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(ours)
        atexit.register(self.close)
        log.info("parallelism: %d ranks (tensor %d × pipeline %d) on %s (workers: pids %s%s)", size, layout.tp_size,
                 layout.pp_size, self.device, ", ".join(str(p.pid) for p in self.procs) or "none",
                 f"; ranks {self.remote.start}-{size - 1} on {config.nnodes - 1} other node(s)" if self.remote else "")
        try:
            deadline = time.monotonic() + config.rendezvous_timeout
            self.group.join(store, self._check_workers, config.rendezvous_timeout)
            if listener is not None:
                remote = listener.wait(deadline)
                self.conns += [remote[r] for r in self.remote]
        except BaseException:
            self.close()
            raise
        finally:
            if listener is not None:
                listener.close()
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
        conn = self.conns[rank - 1]
        proc = self.procs[rank - 1] if rank - 1 < len(self.procs) else None  # None: on another node
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not conn.poll(0.2):
            if proc is not None and not proc.is_alive():
                raise RuntimeError(f"tensor-parallel rank {rank} exited with code {proc.exitcode} while starting")
            if time.monotonic() > deadline:
                raise RuntimeError(f"tensor-parallel rank {rank} did not start within {_START_TIMEOUT_S:g}s")
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError) as exc:
            raise RuntimeError(f"rank {rank} on another node went away while starting") from exc
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

    def finish_step(self) -> None:
        """With pipeline stages: rank 0 samples the oldest step in flight now; stage 0's other tensor-parallel
        ranks join its logits' gather (call right before rank 0's `ModelRunner.finish`)."""
        self.raise_if_failed()
        if self.layout.tp_size > 1:
            self._send(("finish",), ranks=range(1, self.layout.tp_size))

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

    def _send(self, message: tuple[Any, ...], ranks: Sequence[int] | None = None) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            for rank, conn in enumerate(self.conns, start=1):
                if ranks is not None and rank not in ranks:
                    continue
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
        if self._watching:  # once started, another node's rank never writes: anything readable is its end
            for rank in self.remote:
                try:
                    gone = self.conns[rank - 1].poll(0)
                except OSError:
                    gone = True
                if gone:
                    node = rank // self.remote.start  # (node 0 runs ranks 0 .. remote.start - 1; so does each)
                    return f"rank {rank} on node {node} closed its connection (its process or node is gone)"
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
        for rank in self.remote:  # the other nodes' ranks read the end of their channel and exit
            with contextlib.suppress(OSError):
                self.conns[rank - 1].close()
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
            with contextlib.suppress(OSError):
                conn.close()
        if self.failure is None:
            if self.link is not None:
                self.link.flush()
            self.group.close()
        else:  # a peer is gone (its operations fail now that it is killed); should tearing down block, let it
            teardown = threading.Thread(target=self.group.close, name="folio-tp-teardown", daemon=True)
            teardown.start()
            teardown.join(TEARDOWN_WAIT_S)
        torch.set_num_threads(self._threads_before)
        shutil.rmtree(self._tmp, ignore_errors=True)
        atexit.unregister(self.close)


def _exit_later() -> None:
    time.sleep(HARD_EXIT_AFTER_S)
    log.critical("still running %gs after the tensor-parallel group failed; exiting now", HARD_EXIT_AFTER_S)
    logging.shutdown()
    os._exit(1)


def rank_device(device: str, rank: int, size: int) -> torch.device:
    """The device of local rank ``rank`` of the ``size`` a node runs."""
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
