"""A rank other than 0 (of tensor and pipeline parallelism): loads its part of the model, then runs each
step rank 0 sends, until told to stop. It exits non-zero when rank 0 goes away or a collective stalls, so that it never outlives its
replica; rank 0 (`executor`) watches it the same way.

Messages from rank 0, over the rank's pipe: ``("init", num_blocks, enforce_eager)`` once the KV cache
is sized (or one block for the profiling step), ``("resize", num_blocks, enforce_eager)`` after that
step, ``("step", updates, lora_writes)`` per step (its forward), ``("finish",)`` (with pipeline stages, to
stage 0's ranks: the oldest step's logits, whose gather they join), ``("probe",)`` for the collectives health check, ``("stop",)``.
Replies: ``("loaded", stats)``, ``("ready", stats)`` (after init and resize) or ``("error", message)``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import psutil
import torch

from folio.engine.config import EngineConfig, ModelConfig
from folio.engine.distributed.pipeline import Layout

log = logging.getLogger("folio.engine.tp")

LEADER_SILENCE_S = 30.0  # six probe intervals


@dataclass
class WorkerSpec:
    rank: int  # global
    layout: Layout
    store_path: str  # a file, or tcp://HOST:PORT
    config: EngineConfig
    model_config: ModelConfig
    dtype: torch.dtype
    device: str  # "cpu" or "cuda:R"
    threads: int
    log_level: int


class _NoSampling:
    """The sampler of a rank other than 0: rank 0 samples; the others only took part in the gather."""

    def __call__(self, logits: torch.Tensor, seqs: list[Any]) -> None:
        return None

    def prepare(self, seqs: list[Any], vocab_size: int) -> None:
        return None


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    logging.basicConfig(
        level=spec.log_level, format=f"%(asctime)s %(levelname)s [tp rank {spec.rank}] %(name)s: %(message)s"
    )
    try:
        _serve(spec, conn)
    except EOFError:
        log.error("tensor-parallel rank %d: rank 0 closed the connection; exiting", spec.rank)
        os._exit(1)
    except Exception as exc:
        log.exception("tensor-parallel rank %d failed", spec.rank)
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        os._exit(1)


def _serve(spec: WorkerSpec, conn: Connection) -> None:
    from folio.engine.distributed.parallel_state import TensorParallelGroup
    from folio.engine.distributed.pipeline import StageLink, stage_config, stage_layers
    from folio.engine.distributed.sharding import TensorParallel, local_config
    from folio.engine.distributed.step_broadcast import StepMirror
    from folio.engine.distributed.watchdog import Watchdog, parent_gone, stalled_collectives
    from folio.engine.loader import load_model
    from folio.engine.model_runner import ModelRunner, StepHandle
    from folio.engine.warmup import warm_up_kernels

    torch.set_num_threads(spec.threads)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cfg, layout = spec.config, spec.layout
    group = TensorParallelGroup(spec.rank, layout, device, cfg.collective_timeout)
    group.join(spec.store_path)

    def fire(reason: str) -> None:
        log.critical("%s; rank %d exits", reason, spec.rank)
        os._exit(1)

    heard = _Heard()
    checks = [stalled_collectives(group), parent_gone(os.getppid()), heard.silent_for(LEADER_SILENCE_S)]
    watchdog = Watchdog(checks, fire, "folio-tp-watchdog")
    watchdog.start()
    tp = TensorParallel(group.rank, layout.tp_size, group) if layout.tp_size > 1 else None
    mc = spec.model_config
    layers = stage_layers(mc, layout.pp_size, layout.stage(spec.rank))
    model = load_model(cfg.model, mc, spec.dtype, device, mc.max_model_len, tp=tp, layers=layers)
    if layout.pp_size > 1:
        model.pipe = StageLink(layout, spec.rank, group, mc.hidden_size, spec.dtype, device)
    conn.send(("loaded", {"bytes_read": model.load_stats.bytes_read, "rss": psutil.Process().memory_info().rss}))
    kind, num_blocks, enforce_eager = conn.recv()
    assert kind == "init", kind
    lora = _start_lora(spec, model, device)  # before the runner: its graphs record the LoRA ops
    runner = ModelRunner(
        model, stage_config(mc if tp is None else local_config(mc, tp), layers), num_blocks, cfg.block_size,
        spec.dtype, device, cfg.seed, max_num_seqs=cfg.max_num_seqs, max_decode_rows=cfg.max_decode_rows,
        enforce_eager=enforce_eager,
        lora=lora is not None,
    )
    runner.sampler, runner.samples = _NoSampling(), False  # type: ignore[assignment]
    warm_up_kernels(runner, mc.max_model_len)  # compiles this process's kernels, as rank 0 does its own
    conn.send(("ready", _ready(runner)))
    mirror = StepMirror()
    pending: deque[StepHandle | None] = deque()  # stage 0 with stages after it: steps whose logits are to come
    while True:
        heard.waiting()
        message = pickle.loads(conn.recv_bytes())
        heard.got(message[0])
        if message[0] == "step":
            batch = mirror.decode(message[1])
            try:
                if message[2]:
                    assert lora is not None, "adapter slots sent to a rank without LoRA"
                    lora(message[2])
                handle: StepHandle | None = None
                handle = runner.begin(batch)
                if model.pipe is None:
                    runner.finish(handle)
            except Exception:  # rank 0 fails the same step's requests and carries on; so do we
                log.exception("a step failed on rank %d", spec.rank)
            if model.pipe is not None and model.pipe.first:
                pending.append(handle)  # (None for a step that failed here: its "finish" then does nothing)
        elif message[0] == "finish":
            try:
                done = pending.popleft()
                if done is not None:
                    runner.finish(done)
            except Exception:
                log.exception("a step's logits failed on rank %d", spec.rank)
        elif message[0] == "resize":  # the profiling step's cache replaced by the sized one
            _, num_blocks, enforce_eager = message
            runner.resize_kv_cache(num_blocks, enforce_eager=enforce_eager)
            conn.send(("ready", _ready(runner)))
        elif message[0] == "probe":
            group.probe()
        elif message[0] == "stop":
            break
    watchdog.stop()
    if model.pipe is not None:
        model.pipe.flush()
    group.close()


class _Heard:
    """How long this rank has waited for rank 0's next message. Once probes arrive (every PROBE_INTERVAL_S,
    steps or not), a rank 0 silent for long is gone, even where its connection cannot say so (another node
    that lost power). Time in a step of this rank's own does not count."""

    def __init__(self) -> None:
        self.since: float | None = None  # waiting since (None: busy)
        self.armed = False

    def waiting(self) -> None:
        self.since = time.monotonic()

    def got(self, kind: str) -> None:
        self.since = None
        self.armed = self.armed or kind == "probe"

    def silent_for(self, limit_s: float) -> Callable[[], str | None]:
        def check() -> str | None:
            since = self.since
            quiet = 0.0 if since is None else time.monotonic() - since
            return f"rank 0 has sent nothing for {quiet:.0f}s" if self.armed and quiet > limit_s else None

        return check


def _start_lora(spec: WorkerSpec, model: Any, device: torch.device) -> Callable[[list[Any]], None] | None:
    """With enable_lora: this rank's adapter stacks, attached to its layers, and what writes rank 0's slot
    changes into them (each adapter loaded from its folder and cut to this rank's shard)."""
    cfg = spec.config
    if not cfg.enable_lora:
        return None
    from folio.engine.distributed.lora import local_blocks, local_stacks, lora_shard, write_slot
    from folio.engine.layers.lora import attach_lora
    from folio.engine.lora import LoRALayout, load_adapter

    layout = LoRALayout(spec.model_config)
    shards = model.load_stats.shards
    stacks = local_stacks(layout, shards, cfg.max_loras, cfg.max_lora_rank, spec.dtype, device)
    attach_lora(model, stacks, local_blocks(layout, shards))
    shard = lora_shard(shards)

    def write(writes: list[Any]) -> None:
        for index, request in writes:
            adapter = load_adapter(request.lora_path, layout, max_rank=cfg.max_lora_rank, digest=request.digest,
                                   dtype=spec.dtype, name=request.lora_name)
            write_slot(stacks, index, adapter, shard)

    return write


def _ready(runner: Any) -> dict[str, int]:
    return {"rss": psutil.Process().memory_info().rss, "num_blocks": runner.kv_caches[0][0].shape[0]}
