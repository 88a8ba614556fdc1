"""The engine: requests in, one scheduler step at a time, what each request gained in it back.

Not thread-safe: one owner (the offline `LLM` or the server's engine loop) calls every method. Decode-only
steps replay graphs: on CUDA those captured at start-up (`folio.engine.cuda_graphs`), on the CPU step
graphs recorded once a batch size recurs (`folio.engine.cpu_graphs`); prefill and mixed steps run eagerly,
as every step does with `EngineConfig.enforce_eager`.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

import psutil
import torch

from folio.engine import memory_profile, rules
from folio.engine.block_manager import BlockManager
from folio.engine.config import EngineConfig, ModelConfig
from folio.engine.distributed import lora as tp_lora
from folio.engine.distributed.errors import RankFailedError
from folio.engine.distributed.executor import TensorParallelExecutor
from folio.engine.layers.lora import attach_lora
from folio.engine.loader import load_model, load_model_config, resolve_dtype
from folio.engine.lora import LoRAError, LoRALayout, LoRARequest, LoRASlots
from folio.engine.model_runner import ModelRunner, StepHandle, kv_bytes_per_block
from folio.engine.outputs import EngineStats, RequestOutput
from folio.engine.prompt_logits import LogitNoise
from folio.engine.resume import Replay, max_total_tokens, replay
from folio.engine.sampler import SampleResult
from folio.engine.sampling_params import SamplingParams
from folio.engine.scheduler import ScheduledSeq, Scheduler
from folio.engine.sequence import Sequence
from folio.engine.server.openai_errors import ErrorCode
from folio.engine.spec_decode.draft_model import DraftModel
from folio.engine.spec_decode.speculator import Speculator
from folio.engine.structured.compiler import BACKENDS, GrammarCompiler
from folio.engine.tokenizer.detokenizer import IncrementalDetokenizer
from folio.engine.tokenizer.loading import load_tokenizer
from folio.engine.warmup import warm_up_kernels

log = logging.getLogger(__name__)

GIB = 1 << 30
StepResult = tuple[list[ScheduledSeq], SampleResult | None]  # what `ModelRunner.step` returns
# Without kv_cache_memory_gib, the CPU KV cache takes this share of available RAM, at most _CPU_KV_MAX_GIB.
_CPU_KV_RAM_SHARE = 0.2
_CPU_KV_MAX_GIB = 2.0
_DEFAULT_BATCHED_TOKENS = 2048
# A step that raises fails its own requests only; this many failing steps in a row mean the engine itself
# is broken (e.g. a lost device), and the error propagates so that the process can be restarted.
MAX_CONSECUTIVE_STEP_FAILURES = 3


class EngineBrokenError(RuntimeError):
    """Steps keep failing whatever they run: the engine cannot serve any more."""


def eager_only(config: EngineConfig, device: torch.device) -> bool:
    """Whether every step runs eagerly: asked for, or parallelism on CUDA, where NCCL collectives
    inside CUDA graphs have never run on a multi-GPU machine and a stall inside a graph would escape the
    watchdog (only NCCL's own abort would end it)."""
    return config.enforce_eager or (config.world_size > 1 and device.type == "cuda")


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._grammars: GrammarCompiler | None = None
        # what close() releases (the tensor-parallel ranks and their process group, the grammar threads): also
        # when the engine is collected (`del llm`) or the interpreter exits, so that another engine can start
        self._closers: list[Callable[[], None]] = []
        self._finalizer = weakref.finalize(self, _close_all, self._closers)  # never a reference to self
        self.draft: DraftModel | None = None  # a draft model's (speculative decoding), loaded with the target
        self._grammars_lock = threading.Lock()
        self.device = _resolve_device(config.device)
        model_config, declared_dtype = load_model_config(config.model)
        self.dtype = resolve_dtype(config.dtype, declared_dtype, self.device)
        model_config.max_model_len = effective_max_model_len(config, model_config)
        self.model_config: ModelConfig = model_config
        # Tensor and pipeline parallelism: rank 0 (this process) starts the other ranks, which load beside it.
        self.parallel: TensorParallelExecutor | None = None
        self._lora_tracker: tp_lora.SlotTracker | None = None
        if config.world_size > 1:
            self.parallel = TensorParallelExecutor(config, model_config, self.dtype)
            self._closers.append(self.parallel.close)
            self.device = self.parallel.device
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # as the other ranks do: NCCL and graphs use the current device
        self.eager = eager_only(config, self.device)
        if self.eager and not config.enforce_eager:
            log.info("tensor parallelism on CUDA runs every step eagerly (no CUDA graphs around NCCL yet)")
        try:
            model = load_model(
                config.model, model_config, self.dtype, self.device, model_config.max_model_len, config.digest,
                tp=self.parallel and self.parallel.tp, layers=self.parallel and self.parallel.layers,
            )
            if self.parallel is not None:
                model.pipe = self.parallel.link  # (None without pipeline stages)
            self.tokenizer = load_tokenizer(config.model, config.tokenizer)
            rank_config = self.parallel.local_config if self.parallel else model_config  # this device's share
            # what each device's KV cache must hold per block: the largest pipeline stage's layers
            self._kv_config = self.parallel.sizing_config if self.parallel else model_config
            self.lora_slots = self._start_lora(model, model_config)  # before the KV cache takes what is left
            budget = step_token_budget(config, model_config)
            spec = config.speculative
            self.draft = None if spec is None or spec.model is None else DraftModel.load(
                spec.model, model_config, self.tokenizer, self.dtype, self.device)  # before the cache is sized
            self.runner, num_blocks = self._start_runner(model, rank_config, budget)
            if self.draft is not None:
                self.draft.start(num_blocks, config.block_size, config.seed, max_num_seqs=config.max_num_seqs,
                                 max_step_tokens=budget, enforce_eager=self.eager)  # fmt: skip
            self.runner.logit_noise = LogitNoise.create(config.fault_logit_noise, config.seed, self.device)
            warm_up_kernels(self.runner, model_config.max_model_len)
            if self.parallel:
                self.parallel.start_probes()
        except BaseException:
            self.close()
            raise
        eos = set(model_config.eos_token_ids)
        if not eos and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)

        bs = config.block_size
        self.block_manager = BlockManager(num_blocks, bs, config.enable_prefix_caching)
        speculator = Speculator(config.speculative, self.draft) if config.speculative is not None else None
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, budget, config.enable_chunked_prefill, self.lora_slots,
            speculator,
        )
        self._lora_roots: dict[str, int] = {}  # adapter name → its prefix-cache root (negative, never reused)
        self._lora_registrations = 0
        self._seqs: dict[str, Sequence] = {}
        # pipeline stages: the steps begun and not yet sampled, oldest first; requests aborted meanwhile
        self._in_flight: deque[tuple[list[ScheduledSeq], StepHandle]] | None = (
            deque() if config.pipeline_parallel_size > 1 else None)
        self._aborted_in_flight: set[int] = set()  # by id(sequence): a request id may come again
        # micro-batches kept in flight: one per stage (1 makes the stages take turns, the benchmark's baseline)
        self.pipeline_depth = config.pipeline_parallel_size
        self.num_failed_steps = 0
        self._failing_streak = 0
        log.info(
            "KV cache: %d blocks of %d tokens = %d tokens (%.2f GiB); max_model_len %d, dtype %s, device %s",
            num_blocks, bs, num_blocks * bs, num_blocks * kv_bytes_per_block(rank_config, bs, self.dtype) / GIB,
            model_config.max_model_len, str(self.dtype).removeprefix("torch."), self.device,
        )
        if num_blocks * bs < model_config.max_model_len:
            log.warning(
                "the KV cache holds %d tokens, fewer than max_model_len %d: longer requests will be rejected",
                num_blocks * bs, model_config.max_model_len,
            )

    # --- sizing -----------------------------------------------------------------------------------------

    def _start_lora(self, model: torch.nn.Module, cfg: ModelConfig) -> LoRASlots | None:
        """With enable_lora: the layers' adapter stacks (``max_loras`` slots of ``max_lora_rank``) and the
        slots over them; None without."""
        config = self.config
        if not config.enable_lora:
            return None
        layout = LoRALayout(cfg)
        slots, shard = config.max_loras, None
        if self.parallel is None:
            stacks = layout.allocate(slots, config.max_lora_rank, self.dtype, self.device)
            blocks = layout.blocks
        else:  # this rank's shard of each adapter; the other ranks load theirs as rank 0 fills its slots
            shards = model.load_stats.shards
            stacks = tp_lora.local_stacks(layout, shards, slots, config.max_lora_rank, self.dtype, self.device)
            shard = tp_lora.lora_shard(shards)
            blocks = tp_lora.local_blocks(layout, shards)
        attach_lora(model, stacks, blocks)
        lora_slots = LoRASlots(
            config.max_loras, config.max_cpu_loras, model_config=layout, max_rank=config.max_lora_rank,
            stacks=stacks, dtype=self.dtype, shard=shard,
        )
        self._lora_tracker = tp_lora.SlotTracker(lora_slots) if self.parallel else None
        return lora_slots

    def _start_runner(self, model: torch.nn.Module, cfg: ModelConfig, budget: int) -> tuple[ModelRunner, int]:
        """The model runner (every tensor-parallel rank's) with its KV cache: ``kv_cache_memory_gib`` (or
        a share of the CPU's RAM) as given, else what the device has left after the largest step, which
        runs first against a one-block cache. Ranks are alike, so rank 0's profile sizes every rank."""
        config = self.config
        meter = None if config.kv_cache_memory_gib is not None else memory_profile.meter_for(self.device)
        if meter is None:
            num_blocks = self._num_kv_blocks(self._kv_config, self._fixed_kv_budget())
        else:
            num_blocks = memory_profile.PROFILE_KV_BLOCKS
        eager = self.eager or meter is not None  # graphs only once the cache has its size
        if self.parallel:
            self.parallel.start(num_blocks, enforce_eager=eager)  # the workers build theirs beside this one
        runner = ModelRunner(
            model, cfg, num_blocks, config.block_size, self.dtype, self.device, config.seed,
            max_num_seqs=config.max_num_seqs, max_decode_rows=config.max_decode_rows, enforce_eager=eager,
            lora=config.enable_lora,
        )
        if self.parallel:
            self.parallel.wait_ready()
        if meter is None:
            return runner, num_blocks
        self.runner = runner  # the profiling step runs as every step does
        profile = memory_profile.profile_step(runner, meter, budget, config.max_num_seqs, run_step=self._run_step)
        graphs = 0
        if not self.eager and self.device.type == "cuda":
            # The decode graphs' pool and cuBLAS's workspaces come on top of the cache: capture them once
            # against the profiling cache, and keep what they hold out of the cache's budget.
            graphs = memory_profile.held_by(meter, lambda: runner.resize_kv_cache(memory_profile.PROFILE_KV_BLOCKS))
        kv_budget = memory_profile.kv_cache_budget(meter, config.gpu_memory_utilization, profile) - graphs
        log.info(
            "profiled the largest step (%d tokens over %d sequences): %.2f GiB in use, %.2f GiB activations, "
            "%.2f GiB decode graphs; %.2f GiB left for the KV cache at utilization %.2f of %.2f GiB",
            profile.num_tokens, profile.num_seqs, profile.in_use / GIB, profile.activation_bytes / GIB,
            graphs / GIB, kv_budget / GIB, config.gpu_memory_utilization, meter.total() / GIB,
        )
        num_blocks = self._num_kv_blocks(self._kv_config, kv_budget)
        if self.parallel:
            self.parallel.resize(num_blocks, enforce_eager=self.eager)
        runner.resize_kv_cache(num_blocks, enforce_eager=self.eager)
        if self.parallel:
            self.parallel.wait_ready()
        return runner, num_blocks

    def _run_step(self, batch: list[ScheduledSeq]) -> StepResult:
        """One step on this rank's runner, the other ranks running it beside."""
        if self.parallel is not None and self.parallel.link is not None:
            return self._finish_step(self._begin_step(batch))
        self._broadcast(batch)
        return self.runner.step(batch)

    def _broadcast(self, batch: list[ScheduledSeq]) -> None:
        if self.parallel is not None:
            tracker = self._lora_tracker  # the adapter slots rank 0 wrote, for the other ranks to follow
            self.parallel.broadcast_step(batch, tracker.writes() if tracker is not None else ())

    def _begin_step(self, batch: list[ScheduledSeq]) -> StepHandle:
        """A step's forward pass, on this rank and the others (with stages: stage 0's part, handed on)."""
        self._broadcast(batch)
        return self.runner.begin(batch)

    def _finish_step(self, handle: StepHandle) -> StepResult:
        """A begun step's sampling (with stages: once the last stage has sent its rows back)."""
        if self.parallel is not None and self.parallel.link is not None:
            self.parallel.finish_step()
        return self.runner.finish(handle)

    def _fixed_kv_budget(self) -> float:
        """The KV budget without profiling: as configured, else a share of the CPU's available RAM."""
        if self.config.kv_cache_memory_gib is not None:
            return self.config.kv_cache_memory_gib * GIB
        return min(_CPU_KV_MAX_GIB * GIB, psutil.virtual_memory().available * _CPU_KV_RAM_SHARE)

    def _num_kv_blocks(self, cfg: ModelConfig, budget: float) -> int:
        per_block = kv_bytes_per_block(cfg, self.config.block_size, self.dtype)
        if self.draft is not None:  # the draft's cache holds as many tokens: each block pays for both
            per_block += self.draft.block_bytes(self.config.block_size)
        num_blocks = int(budget // per_block)
        # more blocks than every sequence at full length could use would only waste memory
        useful = self.config.max_num_seqs * -(-cfg.max_model_len // self.config.block_size)
        num_blocks = min(num_blocks, useful)
        if num_blocks < 1:
            raise ValueError(
                f"the KV cache budget ({budget / GIB:.3f} GiB) does not hold one block of "
                f"{self.config.block_size} tokens ({per_block} bytes); raise kv_cache_memory_gib or "
                "gpu_memory_utilization"
            )
        return num_blocks

    # --- requests ---------------------------------------------------------------------------------------

    def replay(self, prompt_token_ids: list[int], params: SamplingParams, token_ids: list[int]) -> Replay:
        """The state after output tokens a client already has, for `add_request`'s ``resume``
        (`folio.engine.resume.replay` with this engine's tokenizer, end-of-sequence tokens and context)."""
        if token_ids:
            rules.check_prompt_ids(token_ids, self.model_config.vocab_size, param="folio_resume")
        return replay(
            self.tokenizer, prompt_token_ids, params, token_ids,
            eos_token_ids=self.eos_token_ids, max_model_len=self.model_config.max_model_len,
        )  # fmt: skip

    # --- adapters ---------------------------------------------------------------------------------------

    def add_lora(self, request: LoRARequest) -> None:
        """Register an adapter and load it into the host cache now, so that a bad one raises `LoRAError`
        here and changes nothing. Adding the same request again is a no-op."""
        slots = self._require_lora(request.lora_name)
        if slots.get(request.lora_name) == request:
            return
        slots.register(request)
        try:
            slots.load(request.lora_int_id)
        except BaseException:
            slots.remove(request.lora_name)
            raise
        self._lora_registrations += 1
        self._lora_roots[request.lora_name] = -self._lora_registrations

    def remove_lora(self, name: str) -> bool:
        """Unregister ``name`` (False if unknown): new requests for it are refused; the requests already
        queued or running under it finish (the slots keep it for them)."""
        if self.lora_slots is None or not self.lora_slots.is_registered(name):
            return False
        self.lora_slots.remove(name)
        del self._lora_roots[name]
        return True

    def list_loras(self) -> list[LoRARequest]:
        return [] if self.lora_slots is None else self.lora_slots.loaded()

    def lora_state(self) -> tuple[list[str], list[str]]:
        """Names of the adapters of running requests and of waiting ones (`vllm:lora_requests_info`)."""

        def names(seqs: Iterable[Sequence]) -> list[str]:
            return list(dict.fromkeys(s.lora_request.lora_name for s in seqs if s.lora_request is not None))

        return names(self.scheduler.running), names(self.scheduler.waiting)

    def lora_resident(self) -> list[str]:
        """Names of the adapters in memory (device slots or host cache): a request under one starts without
        reading its files (the router prefers such replicas: `folio_engine_lora_resident`)."""
        slots = self.lora_slots
        if slots is None:
            return []
        ids = {*slots.cached(), *(s.lora_int_id for s in slots.slots if s.lora_int_id)}
        return sorted(r.lora_name for i in ids if (r := slots.by_id.get(i)) is not None)

    def _require_lora(self, name: str) -> LoRASlots:
        if self.lora_slots is None:
            raise LoRAError(f"adapter {name!r}: LoRA is not enabled on this engine (enable_lora / --enable-lora)")
        return self.lora_slots

    def _lora_for(self, request: LoRARequest) -> tuple[LoRARequest, int]:
        """The registered adapter a request names, and its prefix-cache root; `LoRAError` if unknown."""
        known = self._require_lora(request.lora_name).get(request.lora_name)
        if known is None:
            raise LoRAError(f"adapter {request.lora_name!r} is not loaded")
        if known.lora_int_id != request.lora_int_id or known.lora_path != request.lora_path:
            raise LoRAError(f"adapter {request.lora_name!r} is loaded as id {known.lora_int_id} from "
                            f"{known.lora_path}, not id {request.lora_int_id} from {request.lora_path}")
        return known, self._lora_roots[known.lora_name]

    # --- requests ---------------------------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, group: str | None = None,
        resume: Replay | None = None, lora_request: LoRARequest | None = None, priority: int = 0,
    ) -> None:
        """Validate and queue a request; raises `RuleError` (a ValueError, queueing nothing) on bad input, with
        the words the HTTP API uses (`folio.engine.rules`). ``group`` names the client request it is one
        sequence of (the scheduler queues groups fairly); default: its own. ``resume`` continues it after
        output tokens already handed out (`replay` of them): same parameters, ``max_tokens`` counting them.
        ``lora_request`` runs it under a registered adapter (`add_lora`); `LoRAError` (a ValueError) for one
        that is not, or without enable_lora. ``priority``: under the priority scheduling policy, lower is
        served first and preempted last (vLLM's); under fcfs it must be 0."""
        # Only a caller inside Folio can break these (LLM and the server fan n out and number sequences).
        assert request_id not in self._seqs, f"request id {request_id!r} is already in use"
        assert isinstance(params, SamplingParams), f"params must be SamplingParams, got {type(params).__name__}"
        assert params.n == 1, f"the engine runs one sequence per request, got n={params.n}; fan out n first"
        lora, cache_root = self._lora_for(lora_request) if lora_request is not None else (None, None)
        text = prompt if isinstance(prompt, str) else None
        token_ids = list(self.tokenizer(prompt).input_ids) if text is not None else list(prompt)
        rules.check_prompt_ids(token_ids, self.model_config.vocab_size)
        max_len = self.model_config.max_model_len
        # max_tokens is cut to what the context has left (vLLM's offline behaviour): one token must fit
        rules.check_context(len(token_ids), 1, max_len)
        max_total = max_total_tokens(len(token_ids), params.max_tokens, max_len)
        if resume is not None:
            _check_resume(resume)
        blocks = self.block_manager.blocks_needed(max_total)
        if blocks > self.block_manager.num_blocks:
            capacity = self.block_manager.num_blocks * self.block_manager.block_size
            raise rules.RuleError(
                f"the request needs up to {max_total} tokens of KV cache (prompt {len(token_ids)} + max_tokens "
                f"{params.max_tokens}) but the cache holds only {capacity} tokens; lower max_tokens or the prompt",
                param="max_tokens",
                code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
            )
        if priority and self.config.scheduling_policy != "priority":
            raise rules.RuleError(f"priority {priority} needs the priority scheduling policy "
                                  "(--scheduling-policy priority); this engine schedules fcfs", param="priority")  # fmt: skip
        grammar = self._grammar_for(params)
        seq = Sequence(request_id, text, token_ids, params, max_total, self.eos_token_ids, lora, cache_root)
        seq.grammar, seq.priority = grammar, priority
        seq.group = group or request_id
        if params.seed is not None:
            seq.generator = torch.Generator(device=self.device)
            seq.generator.manual_seed(params.seed)
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids, params.skip_special_tokens)
        if resume is not None:
            if grammar is not None:  # the grammar is where the tokens already handed out left it
                for token in resume.token_ids:
                    if not grammar.accept_token(token):
                        raise rules.RuleError("folio_resume: the tokens already sent do not fit the answer's "
                                              "structured-output constraint", param="folio_resume")  # fmt: skip
            seq.resume(resume)
            if seq.generator is not None and not params.greedy:
                for _ in resume.token_ids:  # the one draw per sampled token of `Sampler._sample`
                    torch.rand(1, generator=seq.generator, device=self.device)
        self._seqs[request_id] = seq
        self.scheduler.add(seq)

    @property
    def grammars(self) -> GrammarCompiler:
        """This model's grammar compiler (made on first use: most engines never serve a constrained answer)."""
        with self._grammars_lock:  # the server's request threads may get here at once
            if self._grammars is None:
                backend = BACKENDS[self.config.structured_outputs_backend]
                self._grammars = backend(self.tokenizer, self.model_config.vocab_size, sorted(self.eos_token_ids))
                self._closers.append(self._grammars.close)
            return self._grammars

    def _grammar_for(self, params: SamplingParams) -> Any | None:
        """A fresh matcher of the request's constraint (None without one); checks its logit_bias's tokens.
        The server compiles before it queues a request (`GrammarCompiler.compile` off the step loop), so
        here the compiled grammar comes from the cache; offline, the first request of a schema compiles it."""
        vocab = self.model_config.vocab_size
        for token in params.logit_bias or ():
            if token >= vocab:
                raise rules.RuleError(f"logit_bias: token {token} is not in the vocabulary [0, {vocab})",
                                      param="logit_bias")  # fmt: skip
        if params.structured_outputs is None:
            return None
        return self.grammars.matcher(self.grammars.compile(params.structured_outputs))

    def abort_request(self, request_id: str) -> None:
        seq = self._seqs.pop(request_id, None)
        if seq is None or seq.is_finished:
            return
        if self._in_flight and any(item.seq is seq for batch, _ in self._in_flight for item in batch):
            self._aborted_in_flight.add(id(seq))  # a stage still computes into its blocks
            return
        self.scheduler.finish(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def stats(self) -> EngineStats:
        s = self.scheduler
        return EngineStats(
            num_running=len(s.running),
            num_waiting=len(s.waiting),
            kv_cache_usage=self.block_manager.usage,
            num_preemptions_total=s.num_preemptions_total,
            prefix_cache_queries_total=s.prefix_cache_queries_total,
            prefix_cache_hits_total=s.prefix_cache_hits_total,
            spec_decode=replace(s.speculator.stats, accepted_per_position=list(s.speculator.stats.accepted_per_position))
            if s.speculator is not None else None,
        )

    # --- stepping ---------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Runs one scheduled step; returns what each request gained in it. An exception from the model or
        the sampler fails the requests of this step (finish reason "error") and no others; only a run of
        failing steps raises EngineBrokenError. With pipeline stages, see `_pipelined_step`."""
        if self._in_flight is not None:
            return self._pipelined_step()
        batch = self.scheduler.schedule()
        failed = self.scheduler.take_failed()  # e.g. an adapter whose files could not be loaded
        for seq in failed:
            self._seqs.pop(seq.request_id, None)
        if not batch:
            return [seq.take_output() for seq in failed]
        speculator = self.scheduler.speculator
        started = time.perf_counter()
        try:
            sampled, result = self._run_step(batch)
            if speculator is not None and all(item.seq.num_uncomputed_tokens == 1 == item.num_tokens - len(item.draft)
                                              for item in batch):  # fmt: skip
                # a decode step (verify positions included): what its size costs here, for the back-off
                speculator.step_ran(sum(item.num_tokens for item in batch), time.perf_counter() - started)
        except RankFailedError as exc:
            raise EngineBrokenError(str(exc)) from exc
        except Exception as exc:
            lost = self.parallel and self.parallel.failure_after(wait_s=1.0)  # a collective error: a rank lost?
            if lost:
                raise EngineBrokenError(str(lost)) from exc
            self.num_failed_steps += 1
            self._failing_streak += 1
            if self._failing_streak >= MAX_CONSECUTIVE_STEP_FAILURES:
                raise EngineBrokenError(f"{self._failing_streak} steps in a row failed; the last: {exc!r}") from exc
            updated = self.scheduler.fail([item.seq for item in batch], exc)
        else:
            self._failing_streak = 0
            updated = self.scheduler.postprocess(batch, sampled, result, time.monotonic())
        for seq in updated:
            if seq.is_finished:
                del self._seqs[seq.request_id]
        return [seq.take_output() for seq in [*failed, *updated]]

    def _pipelined_step(self) -> list[RequestOutput]:
        """With P pipeline stages: begin steps until P are in flight (or nothing else can run: a sequence is in
        one step at a time), then finish the oldest and return what its requests gained. While stage 0 runs
        one micro-batch the later stages run the ones before it, so the stages work at once.

        A step that fails here may have left a stage waiting for a transfer that never comes: the engine
        is broken (`EngineBrokenError`), never serving with half a pipeline."""
        in_flight = self._in_flight
        assert in_flight is not None
        failed: list[Sequence] = []
        stages = self.pipeline_depth
        scheduler = self.scheduler
        try:
            while len(in_flight) < stages:
                busy = {id(item.seq) for batch, _ in in_flight for item in batch}
                # a micro-batch's share of the sequences, so that every stage has one to work on
                share = -(-(len(scheduler.running) + len(scheduler.waiting)) // stages)
                batch = scheduler.schedule(busy, max_seqs=max(1, share))
                failed += scheduler.take_failed()  # e.g. an adapter whose files could not be loaded
                if not batch:
                    break
                in_flight.append((batch, self._begin_step(batch)))
            if not in_flight:
                for seq in failed:
                    self._seqs.pop(seq.request_id, None)
                return [seq.take_output() for seq in failed]
            batch, handle = in_flight.popleft()
            sampled, result = self._finish_step(handle)
        except Exception as exc:
            lost = self.parallel and self.parallel.failure_after(wait_s=1.0)  # the watchdog's reason, if any
            raise EngineBrokenError(str(lost) if lost else f"a pipelined step failed: {exc!r}") from exc
        updated = self.scheduler.postprocess(batch, sampled, result, time.monotonic())
        aborted = {id(item.seq) for item in batch} & self._aborted_in_flight
        for item in batch:  # aborted while in flight: finished now that no stage reads its blocks
            if id(item.seq) in aborted and not item.seq.is_finished:
                self.scheduler.finish(item.seq)
        self._aborted_in_flight -= aborted
        news = [seq for seq in [*failed, *updated] if id(seq) not in aborted]
        for seq in news:
            if seq.is_finished:
                self._seqs.pop(seq.request_id, None)
        return [seq.take_output() for seq in news]

    def close(self) -> None:
        """Stop the other tensor-parallel ranks and tear their process group down, and the grammar compiler's
        threads; once (later calls do nothing). A collected engine does it on its own."""
        self._finalizer()


def _close_all(closers: list[Callable[[], None]]) -> None:
    for close in reversed(closers):
        close()


def _check_resume(resume: Replay) -> None:
    """A continuation must be one the run could have gone on from (the replay ran its tokens to the limits)."""
    if resume.finish is not None:
        raise rules.RuleError(
            f"folio_resume: the tokens already end the choice ({resume.finish[0]}); no room is left to continue",
            param="folio_resume",
        )


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available")
    return torch.device(device)


def effective_max_model_len(config: EngineConfig, cfg: ModelConfig) -> int:
    limit = cfg.max_position_embeddings
    if config.max_model_len is None:
        return limit
    if config.max_model_len > limit:
        raise ValueError(
            f"max_model_len {config.max_model_len} exceeds the model's max_position_embeddings {limit}"
        )
    return config.max_model_len


def step_token_budget(config: EngineConfig, model_config: ModelConfig) -> int:
    """The most tokens one step runs: the scheduler's budget, and what the activation reserve must cover
    (without chunked prefill a whole max_model_len prompt runs in one step)."""
    budget = config.max_num_batched_tokens or max(_DEFAULT_BATCHED_TOKENS, config.max_num_seqs)
    if not config.enable_chunked_prefill:
        budget = max(budget, model_config.max_model_len)
    return budget
