"""The engine: requests in, one scheduler step at a time, what each request gained in it back.

Not thread-safe: one owner (the offline `LLM` or the server's engine loop) calls every method. On CUDA,
decode-only steps replay CUDA graphs captured at start-up (`folio.engine.cuda_graphs`); prefill and mixed
steps run eagerly, as every step does with `EngineConfig.enforce_eager` or on the CPU.
"""

from __future__ import annotations

import logging
import time

import psutil
import torch

from folio.engine.block_manager import BlockManager
from folio.engine.config import EngineConfig, ModelConfig
from folio.engine.distributed.errors import RankFailedError
from folio.engine.distributed.executor import TensorParallelExecutor
from folio.engine.loader import load_model, load_model_config, resolve_dtype
from folio.engine.model_runner import ModelRunner, kv_bytes_per_block
from folio.engine.outputs import EngineStats, RequestOutput
from folio.engine.sampling_params import SamplingParams
from folio.engine.scheduler import Scheduler
from folio.engine.sequence import Sequence
from folio.engine.tokenizer.detokenizer import IncrementalDetokenizer
from folio.engine.tokenizer.loading import load_tokenizer

log = logging.getLogger(__name__)

GIB = 1 << 30
# Without kv_cache_memory_gib, the CPU KV cache takes this share of available RAM, at most _CPU_KV_MAX_GIB.
_CPU_KV_RAM_SHARE = 0.2
_CPU_KV_MAX_GIB = 2.0
_DEFAULT_BATCHED_TOKENS = 2048
# A step that raises fails its own requests only; this many failing steps in a row mean the engine itself
# is broken (e.g. a lost device), and the error propagates so that the process can be restarted.
MAX_CONSECUTIVE_STEP_FAILURES = 3


class EngineBrokenError(RuntimeError):
    """Steps keep failing whatever they run: the engine cannot serve any more."""


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = _resolve_device(config.device)
        model_config, declared_dtype = load_model_config(config.model)
        self.dtype = resolve_dtype(config.dtype, declared_dtype, self.device)
        model_config.max_model_len = _max_model_len(config, model_config)
        self.model_config: ModelConfig = model_config
        # Tensor parallelism: rank 0 (this process) starts the other ranks, which load beside it.
        self.parallel: TensorParallelExecutor | None = None
        if config.tensor_parallel_size > 1:
            self.parallel = TensorParallelExecutor(config, model_config, self.dtype)
            self.device = self.parallel.device
        try:
            model = load_model(
                config.model, model_config, self.dtype, self.device, model_config.max_model_len, config.digest,
                tp=self.parallel and self.parallel.tp,
            )
            self.tokenizer = load_tokenizer(config.model, config.tokenizer)
            rank_config = self.parallel.local_config if self.parallel else model_config  # this device's share
            num_blocks = self._num_kv_blocks(rank_config)
            if self.parallel:
                self.parallel.start(num_blocks)
        except BaseException:
            self.close()
            raise
        eos = set(model_config.eos_token_ids)
        if not eos and self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = frozenset(eos)

        bs = config.block_size
        budget = step_token_budget(config, model_config)
        self.block_manager = BlockManager(num_blocks, bs, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, budget, config.enable_chunked_prefill)
        self.runner = ModelRunner(
            model, rank_config, num_blocks, bs, self.dtype, self.device, config.seed,
            max_num_seqs=config.max_num_seqs, enforce_eager=config.enforce_eager,
        )
        self._seqs: dict[str, Sequence] = {}
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

    def _num_kv_blocks(self, cfg: ModelConfig) -> int:
        per_block = kv_bytes_per_block(cfg, self.config.block_size, self.dtype)
        if self.config.kv_cache_memory_gib is not None:
            budget = self.config.kv_cache_memory_gib * GIB
        elif self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            used = total - free
            budget = total * self.config.gpu_memory_utilization - used - self._activation_reserve(cfg)
        else:
            budget = min(_CPU_KV_MAX_GIB * GIB, psutil.virtual_memory().available * _CPU_KV_RAM_SHARE)
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

    def _activation_reserve(self, cfg: ModelConfig) -> int:
        """A generous estimate of the forward pass's peak temporary memory on the GPU."""
        tokens = step_token_budget(self.config, cfg)  # the largest step: max_model_len with chunking off
        elem = torch.empty((), dtype=self.dtype).element_size()
        per_token = (4 * cfg.hidden_size + 3 * cfg.intermediate_size + 3 * cfg.num_attention_heads * cfg.head_dim)
        logits = self.config.max_num_seqs * cfg.vocab_size * 4 * 4
        return 2 * tokens * per_token * elem + logits + GIB // 2

    # --- requests ---------------------------------------------------------------------------------------

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, group: str | None = None
    ) -> None:
        """Validate and queue a request; raises ValueError (queueing nothing) on bad input. ``group`` names
        the client request it is one sequence of (the scheduler queues groups fairly); default: its own."""
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        if params.n != 1:
            raise ValueError(f"the engine runs one sequence per request (n=1), got n={params.n}; fan out n first")
        if isinstance(prompt, str):
            text: str | None = prompt
            token_ids = list(self.tokenizer(prompt).input_ids)
        else:
            text = None
            token_ids = list(prompt)
            vocab = self.model_config.vocab_size
            bad = [t for t in token_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
            if bad:
                raise ValueError(f"prompt token ids must be integers in [0, {vocab}), got {bad[0]!r}")
        if not token_ids:
            raise ValueError("the prompt is empty (0 tokens)")
        max_len = self.model_config.max_model_len
        if len(token_ids) >= max_len:
            raise ValueError(
                f"the prompt has {len(token_ids)} tokens but max_model_len is {max_len} "
                "(prompt plus at least one generated token must fit)"
            )
        max_total = min(len(token_ids) + params.max_tokens, max_len)
        blocks = self.block_manager.blocks_needed(max_total)
        if blocks > self.block_manager.num_blocks:
            capacity = self.block_manager.num_blocks * self.block_manager.block_size
            raise ValueError(
                f"the request needs up to {max_total} tokens of KV cache (prompt {len(token_ids)} + max_tokens "
                f"{params.max_tokens}) but the cache holds only {capacity} tokens; lower max_tokens or the prompt"
            )
        seq = Sequence(request_id, text, token_ids, params, max_total, self.eos_token_ids)
        seq.group = group or request_id
        if params.seed is not None:
            seq.generator = torch.Generator(device=self.device)
            seq.generator.manual_seed(params.seed)
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids, params.skip_special_tokens)
        self._seqs[request_id] = seq
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        seq = self._seqs.pop(request_id, None)
        if seq is not None and not seq.is_finished:
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
        )

    # --- stepping ---------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Runs one scheduled step; returns what each request gained in it. An exception from the model or
        the sampler fails the requests of this step (finish reason "error") and no others; only a run of
        failing steps raises EngineBrokenError."""
        batch = self.scheduler.schedule()
        if not batch:
            return []
        try:
            if self.parallel is not None:
                self.parallel.broadcast_step(batch)  # the other ranks run the same step beside this one
            sampled, result = self.runner.step(batch)
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
        return [seq.take_output() for seq in updated]

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (nothing to do without tensor parallelism)."""
        if self.parallel is not None:
            self.parallel.close()


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was requested but CUDA is not available")
    return torch.device(device)


def _max_model_len(config: EngineConfig, cfg: ModelConfig) -> int:
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
