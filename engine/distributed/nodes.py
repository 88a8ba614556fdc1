"""One engine over several nodes (pods): where each rank runs and how the nodes find rank 0.

The T × P ranks are spread over ``nnodes`` nodes, ``T × P / nnodes`` each, in rank order: node R runs
ranks ``R × L`` to ``R × L + L - 1`` (so a stage's tensor-parallel group never straddles nodes). Node 0 runs
rank 0, which schedules, serves HTTP and hosts the rendezvous: the process group's TCP store at
``master_addr:master_port`` and its step channel at ``master_port + 1``, a `multiprocessing` listener
that the other nodes' ranks connect to (their steps then arrive as a local rank's do over its pipe). The
channel authenticates with ``FOLIO_GROUP_KEY`` when set (a secret every pod of the group shares); without
it the key is derived from the group's address, which keeps unrelated groups apart but is no secret: the
NetworkPolicy that admits only the group's pods to these ports is then the boundary.

Another node runs headless (`run_headless`): it starts its ranks, each of which connects to rank 0 (retrying
until it listens: the pods of a group start in any order), and exits non-zero as soon as one of them
fails, so that the group is recreated (LeaderWorkerSet's RecreateGroupOnPodRestart; `folio up`'s
supervisor does the same).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.connection import Client, Connection, Listener

from folio.engine.config import EngineConfig
from folio.engine.distributed.worker import WorkerSpec, worker_main

log = logging.getLogger("folio.engine.nodes")

GROUP_KEY_ENV = "FOLIO_GROUP_KEY"
CONNECT_RETRY_S = 0.5


def ranks_per_node(config: EngineConfig) -> int:
    return config.world_size // config.nnodes


def node_ranks(config: EngineConfig) -> range:
    """The global ranks this node runs."""
    per = ranks_per_node(config)
    return range(config.node_rank * per, (config.node_rank + 1) * per)


def store_address(config: EngineConfig) -> str:
    return f"tcp://{config.master_addr}:{config.master_port}"


def step_address(config: EngineConfig) -> tuple[str, int]:
    return config.master_addr, config.master_port + 1


def group_key(config: EngineConfig) -> bytes:
    key = os.environ.get(GROUP_KEY_ENV)
    if key:
        return key.encode()
    return hashlib.sha256(f"folio-group/{config.master_addr}:{config.master_port}".encode()).digest()


class StepListener:
    """Rank 0's side of the step channel: accepts the other nodes' ranks (each says which it is first)."""

    def __init__(self, config: EngineConfig, expected: range) -> None:
        self.expected = set(expected)
        self.conns: dict[int, Connection] = {}
        self.error: str | None = None
        self._listener = Listener(("0.0.0.0", config.master_port + 1), authkey=group_key(config))
        self._thread = threading.Thread(target=self._accept, name="folio-step-listener", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while set(self.conns) != self.expected:
            try:
                conn = self._listener.accept()
            except mp.AuthenticationError as exc:  # a stranger (or another group): not ours
                log.warning("refused a connection to the step channel: %s", exc)
                continue
            except OSError:
                return  # closed
            kind, rank = conn.recv()
            if kind != "hello" or rank not in self.expected or rank in self.conns:
                log.warning("refused a step connection announcing %s %r", kind, rank)
                conn.close()
                continue
            self.conns[rank] = conn

    def wait(self, deadline: float) -> dict[int, Connection]:
        """Every expected rank's connection (they have all joined the store by now: they connect first)."""
        self._thread.join(max(0.0, deadline - time.monotonic()))
        missing = sorted(self.expected - set(self.conns))
        if missing:
            raise RuntimeError(f"ranks {missing} joined the group but not the step channel")
        return self.conns

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()


def connect_to_leader(config: EngineConfig, rank: int, timeout_s: float) -> Connection:
    """This rank's step channel from rank 0, retrying until rank 0 listens or ``timeout_s`` pass."""
    address, key = step_address(config), group_key(config)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = Client(address, authkey=key)
            break
        except (ConnectionRefusedError, OSError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank {rank} could not reach rank 0 at {address[0]}:{address[1]} within "
                                   f"{timeout_s:g}s ({exc})") from exc  # fmt: skip
            time.sleep(CONNECT_RETRY_S)
    conn.send(("hello", rank))
    return conn


def remote_worker_main(spec: WorkerSpec, config: EngineConfig) -> None:
    """A rank on a node other than 0: connect to rank 0, then serve its steps as any worker does."""
    logging.basicConfig(
        level=spec.log_level, format=f"%(asctime)s %(levelname)s [rank {spec.rank}] %(name)s: %(message)s"
    )
    try:
        conn = connect_to_leader(config, spec.rank, config.rendezvous_timeout)
    except RuntimeError as exc:
        log.critical("%s", exc)
        os._exit(1)
    worker_main(spec, conn)
    os._exit(0)


def run_headless(config: EngineConfig) -> int:
    """A node other than 0 (``--headless``): run its ranks until rank 0 stops them (exit 0) or one fails
    (exit 1, the others killed: a group is never left running with a rank missing)."""
    import torch

    from folio.engine.distributed.executor import rank_device
    from folio.engine.distributed.pipeline import Layout
    from folio.engine.llm_engine import effective_max_model_len
    from folio.engine.loader import load_model_config, resolve_dtype

    model_config, declared = load_model_config(config.model)
    model_config.max_model_len = effective_max_model_len(config, model_config)
    layout = Layout(config.tensor_parallel_size, config.pipeline_parallel_size)
    ranks = node_ranks(config)
    local = len(ranks)
    first_device = rank_device(config.device, 0, local)
    dtype = resolve_dtype(config.dtype, declared, first_device)
    threads = max(1, (os.cpu_count() or 1) // local) if first_device.type == "cpu" else torch.get_num_threads()
    ctx = mp.get_context("spawn")
    procs = []
    for i, rank in enumerate(ranks):
        spec = WorkerSpec(rank, layout, store_address(config), config, model_config, dtype,
                          str(rank_device(config.device, i, local)), threads,
                          logging.getLogger().getEffectiveLevel())  # fmt: skip
        proc = ctx.Process(target=remote_worker_main, args=(spec, config), name=f"folio-rank{rank}")
        proc.start()
        procs.append(proc)
    log.info("node %d of %d: ranks %d-%d (pids %s), rank 0 at %s:%d", config.node_rank, config.nnodes, ranks.start,
             ranks.stop - 1, ", ".join(str(p.pid) for p in procs), config.master_addr, config.master_port)

    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    while not stopping.is_set():
        failed = next((p for p in procs if p.exitcode not in (None, 0)), None)
        if failed is not None:
            log.critical("%s (pid %d) exited with code %s; taking this node's ranks down", failed.name, failed.pid,
                         failed.exitcode)  # fmt: skip
            break
        if all(p.exitcode == 0 for p in procs):
            return 0  # rank 0 stopped the group
        time.sleep(0.2)
    for p in procs:
        if p.is_alive():
            p.kill()
        p.join(5)
    return 0 if stopping.is_set() else 1
