"""Runs one scheduled step: builds the flat token batch and attention context, runs the model, samples."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from folio.engine import cpu_heap, prompt_logits
from folio.engine.block_tables import BlockTables
from folio.engine.config import ModelConfig
from folio.engine.cpu_graphs import CpuDecodeGraphs
from folio.engine.layers.context import AttentionContext, DecodeBucket, PrefillSegment
from folio.engine.layers.lora import LoRAContext
from folio.engine.models.base import DecoderLM
from folio.engine.sampler import Sampler, SampleResult, first_max, plain_greedy
from folio.engine.scheduler import ScheduledSeq
from folio.engine.spec_decode.rejection import verify, verify_greedy
from folio.engine.structured import mask
from folio.kernels import decode_attention_cpu
from folio.kernels.layout import allocate_kv_cache, kv_cache_block_bytes

if TYPE_CHECKING:
    from folio.engine.cuda_graphs import DecodeGraphs, GraphFactory
    from folio.engine.sequence import Sequence

# Without the native kernel, CPU decode attention pads each sequence's keys to the longest in its batch;
# splitting the decodes into a few buckets of similar length cuts that padding at the cost of more calls.
_MAX_DECODE_BUCKETS = 16
_MIN_DECODE_BUCKET = 4


@dataclass(frozen=True)
class DraftRow:
    """One position of a verify step (a sequence's last token, or a proposal after it) laid out as a decode
    row of its own: the decode paths (the native kernel, the step graphs, the CUDA kernels) read its context
    from the paged cache up to and including it, which holds the positions before it once the step's K/V
    are written, as causal attention needs."""

    item: ScheduledSeq  # the verifying sequence's
    start: int  # its position
    token: int
    num_tokens: int = 1

    @property
    def seq(self) -> Sequence:
        return self.item.seq


Row = ScheduledSeq | DraftRow


@dataclass
class StepHandle:
    """A step whose forward pass has run here (`ModelRunner.begin`) and whose sampling is to come (`finish`)."""

    inputs: StepInputs
    hidden: torch.Tensor | None  # None until a pipeline's last stage sends its rows back
    picked: bool  # the hidden states are the logit rows only (else every row of the step)


@dataclass
class StepInputs:
    """One step's tokens laid out as the attention context expects (`folio.engine.layers.context`): the
    prefill chunks, then the decodes by ascending context length (so length buckets are row ranges of similar
    lengths), a verifying sequence's positions as consecutive `DraftRow`s in its place (rows of one context,
    which the native kernel reads once for all of them)."""

    ordered: list[Row]
    num_prefill_tokens: int
    sampling: list[ScheduledSeq] = field(default_factory=list)  # those that get tokens, in the layout's order
    input_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)  # the cache slot of each token's K/V
    context_lens: list[int] = field(default_factory=list)  # per row, this step's tokens included
    prefills: list[PrefillSegment] = field(default_factory=list)
    # each sampling sequence's last row (and, verifying, its proposals' rows), in the order of `sampling`
    logit_rows: list[int] = field(default_factory=list)
    lora_slots: list[int] = field(default_factory=list)  # each token's adapter slot (-1: base); [] for none

    @property
    def has_lora(self) -> bool:
        return bool(self.lora_slots)

    @property
    def decodes(self) -> list[Row]:
        return self.ordered[len(self.prefills) :]

    @property
    def rows_in_order(self) -> bool:
        """Whether the logit rows are every row, in order (the hidden states need no picking)."""
        return self.logit_rows == list(range(len(self.input_ids)))


def prepare_inputs(
    batch: list[ScheduledSeq], block_size: int, device: torch.device, *, lora: bool = False
) -> StepInputs:
    """The step's flat token batch, shared by the eager and the CUDA-graph paths; with ``lora`` (the engine
    serves adapters), each token's adapter slot where the step has an adapter token."""
    prefills = [s for s in batch if s.num_tokens > 1 and not s.draft]
    units: list[list[Row]] = [[s] for s in batch if s.num_tokens == 1]
    for s in batch:
        if s.draft:
            first = s.seq.num_computed_tokens
            units.append([DraftRow(s, first + j, t) for j, t in enumerate([s.seq.token_ids[first], *s.draft])])
    units.sort(key=lambda rows: rows[0].start)  # a verifying sequence's rows together: the kernel reads one context
    decodes = [row for rows in units for row in rows]
    inputs = StepInputs([*prefills, *decodes], num_prefill_tokens=sum(s.num_tokens for s in prefills))
    bs = block_size
    verify_rows: dict[int, list[int]] = {}  # a verifying item's rows, by id, in the order of its positions
    for item in inputs.ordered:
        seq, start = item.seq, item.start
        end = start + item.num_tokens
        row = len(inputs.input_ids)
        table = seq.block_table
        if isinstance(item, DraftRow):
            inputs.input_ids.append(item.token)
            rows = verify_rows.setdefault(id(item.item), [])
            if not rows:  # it samples from its first row's place in the layout on
                inputs.sampling.append(item.item)
            rows.append(row)
        else:
            inputs.input_ids.extend(seq.token_ids[start:end])
            if item.samples:
                inputs.sampling.append(item)
        inputs.positions.extend(range(start, end))
        inputs.slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
        inputs.context_lens.append(end)
        if item.num_tokens > 1:
            blocks = None
            if start > 0:
                blocks = torch.tensor(table[: -(-end // bs)], dtype=torch.long, device=device)
            inputs.prefills.append(PrefillSegment(row, row + item.num_tokens, end, blocks))
    row_ends = list(itertools.accumulate(item.num_tokens for item in inputs.ordered))
    where = {id(item): end - 1 for item, end in zip(inputs.ordered, row_ends, strict=True)}
    for item in inputs.sampling:  # its last token's row (verifying: then each proposal's, rows sorted by position)
        inputs.logit_rows += verify_rows[id(item)] if item.draft else [where[id(item)]]
    if lora and any(item.seq.lora_slot >= 0 for item in inputs.ordered):
        inputs.lora_slots = [item.seq.lora_slot for item in inputs.ordered for _ in range(item.num_tokens)]
    return inputs


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """What one KV-cache block of this model costs, all layers' keys and values together."""
    return kv_cache_block_bytes(block_size, cfg.num_key_value_heads, cfg.head_dim, dtype, cfg.num_hidden_layers)


class ModelRunner:
    logit_noise: prompt_logits.LogitNoise | None = None  # the --fault-logit-noise test aid, set by the engine

    def __init__(
        self,
        model: DecoderLM,
        cfg: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        seed: int,
        *,
        max_num_seqs: int = 256,
        max_decode_rows: int | None = None,
        enforce_eager: bool = False,
        lora: bool = False,
    ) -> None:
        """``max_decode_rows``: the decode graphs' largest step (default ``max_num_seqs``; more with speculation:
        `EngineConfig.max_decode_rows`). ``lora``: the model has adapter stacks (`attach_lora`): steps carry
        each token's slot."""
        self.model = model
        self.lora = lora
        self.cfg = cfg
        self.block_size = block_size
        self.device = device
        if device.type == "cpu":
            cpu_heap.keep_step_memory()
        self.kv_caches = allocate_kv_cache(
            cfg.num_hidden_layers, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim, dtype, device
        )
        self.sampler = Sampler(seed, device)
        self.samples = True  # False on the ranks other than 0 (`folio.engine.distributed.worker`): rank 0 samples
        self.block_tables = BlockTables(block_size, device)
        self.use_kernels = device.type == "cuda"
        model.use_kernels(self.use_kernels)
        if device.type == "cpu":
            model.store_weights_for_cpu(dtype)
        # CPU decode attention: the native kernel where this build has it, else gather + SDPA in buckets
        self.native_decode = device.type == "cpu" and decode_attention_cpu.supports(self.kv_caches[0][0])
        self._gather: tuple[torch.Tensor, torch.Tensor] | None = None
        self.max_decode_rows = max_decode_rows or max_num_seqs
        self.decode_graphs: DecodeGraphs | CpuDecodeGraphs | None = None
        self._start_decode_graphs(enforce_eager)

    def resize_kv_cache(self, num_blocks: int, *, enforce_eager: bool = False) -> None:
        """Replaces the cache (e.g. the profiling step's single block) with ``num_blocks`` empty blocks;
        decode graphs, which hold the old cache's addresses, are captured again."""
        layers, kv_heads, head_dim, dtype = self.kv_caches_shape
        self.decode_graphs = None
        self._gather = None
        self.kv_caches = []  # the old cache goes before the new one is allocated
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.kv_caches = allocate_kv_cache(layers, num_blocks, self.block_size, kv_heads, head_dim, dtype, self.device)
        self.block_tables = BlockTables(self.block_size, self.device)
        self._start_decode_graphs(enforce_eager)

    def _start_decode_graphs(self, enforce_eager: bool) -> None:
        """CUDA graphs on a GPU; on the CPU, step graphs over the native kernels (not on a tensor-parallel
        rank, whose steps hold collectives)."""
        if enforce_eager or not self.model.supports_decode_graphs or self.model.pipe is not None:
            return  # (a pipeline stage's forward sends and receives)
        if self.device.type == "cuda":
            self.enable_decode_graphs()
        elif self.native_decode and self.model.vocab_parallel is None:
            self.decode_graphs = CpuDecodeGraphs(
                lambda ids, pos, ctx: self.model(ids, pos, self.kv_caches, ctx, None),
                max_batch_size=self.max_decode_rows, max_model_len=self.cfg.max_model_len, block_size=self.block_size,
                lora=self.lora,
            )  # fmt: skip

    @property
    def kv_caches_shape(self) -> tuple[int, int, int, torch.dtype]:
        """(layers, KV heads, head_dim, dtype) of the cache."""
        k = self.kv_caches[0][0]
        return len(self.kv_caches), k.shape[2], k.shape[3], k.dtype

    @torch.inference_mode()
    def step(self, batch: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], SampleResult | None]:
        """Compute the scheduled tokens; return the sequences that got a new token and the sampling result."""
        return self.finish(self.begin(batch))

    @torch.inference_mode()
    def begin(self, batch: list[ScheduledSeq]) -> StepHandle:
        """This rank's forward pass of a step (a pipeline stage's part: its layers, handed on to the next)."""
        inputs = prepare_inputs(batch, self.block_size, self.device, lora=self.lora)
        pipe = self.model.pipe
        if pipe is None:  # (a pipeline's first stage prepares when the step's rows come back)
            self.sampler.prepare([s.seq for s in inputs.sampling], self.model.config.vocab_size)  # beside the forward
        if self._fits_decode_graphs(inputs):
            return StepHandle(inputs, self._graph_forward(inputs), picked=False)
        decodes = inputs.decodes
        ctx = AttentionContext(
            slot_mapping=torch.tensor(inputs.slots, dtype=torch.long, device=self.device),
            prefills=inputs.prefills,
            num_prefill_tokens=inputs.num_prefill_tokens,
        )
        if self.use_kernels:
            self._kernel_context(ctx, inputs)
        elif decodes:
            lens = inputs.context_lens[len(inputs.prefills) :]
            self._decode_context(ctx, decodes, lens, inputs.num_prefill_tokens)

        ids = torch.tensor(inputs.input_ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(inputs.positions, dtype=torch.long, device=self.device)
        # With prompts in the step, most rows need no logits: the model hands back the sampled ones only.
        only_rows = None
        if inputs.prefills and not prompt_logits.wanted(inputs):
            only_rows = torch.tensor(inputs.logit_rows, dtype=torch.long, device=self.device)
        if inputs.has_lora:
            ctx.lora = LoRAContext.build(inputs.lora_slots, self.device)
            if only_rows is not None:  # the last layer's output projection and MLP run those rows only
                ctx.lora.rows = LoRAContext.build([inputs.lora_slots[r] for r in inputs.logit_rows], self.device)
        hidden = self.model(ids, pos, self.kv_caches, ctx, only_rows)
        if pipe is not None and pipe.last and not pipe.first:
            assert hidden is not None
            pipe.send_output(hidden)  # stage 0 computes the logits
            hidden = None
        return StepHandle(inputs, hidden, picked=only_rows is not None)

    @torch.inference_mode()
    def finish(self, handle: StepHandle) -> tuple[list[ScheduledSeq], SampleResult | None]:
        """The logits and sampling of a step `begin` ran (on a pipeline's first stage, once the last stage
        has sent the rows back; the other stages have nothing to do here)."""
        inputs, hidden, pipe = handle.inputs, handle.hidden, self.model.pipe
        if pipe is not None and not pipe.first:
            return [], None
        if hidden is None:
            assert pipe is not None and not pipe.last
            hidden = pipe.recv_output(len(inputs.logit_rows) if handle.picked else len(inputs.input_ids))
            self.sampler.prepare([s.seq for s in inputs.sampling], self.model.config.vocab_size)
        if prompt_logits.wanted(inputs):
            prompt_logits.collect(self.model.compute_logits, hidden, inputs, self.logit_noise)
        if not inputs.sampling:
            return [], None
        if not handle.picked and not inputs.rows_in_order:
            hidden = hidden[torch.tensor(inputs.logit_rows, dtype=torch.long, device=self.device)]
        return self._sample(hidden, inputs.sampling)

    def _sample(
        self, hidden: torch.Tensor, sampling: list[ScheduledSeq]
    ) -> tuple[list[ScheduledSeq], SampleResult | None]:
        """The sampling sequences' next tokens from their rows' hidden states (eager and graph steps)."""
        if any(item.draft for item in sampling):
            logits = self._logits(hidden)  # (every rank joins the vocabulary's gather; rank 0 verifies)
            return sampling, self._verify(logits, sampling) if self.samples else None
        seqs = [s.seq for s in sampling]
        if self.logit_noise is None and plain_greedy(seqs):
            tokens = self.model.greedy_tokens(hidden)
            if tokens is not None:  # the greedy tokens without the float32 logits (CPU, float32)
                return sampling, SampleResult.greedy(tokens.tolist())
        return sampling, self.sampler(self._logits(hidden), seqs)

    def _verify(self, logits: torch.Tensor, sampling: list[ScheduledSeq]) -> SampleResult:
        """A step with proposals: each proposing sequence's rows (its last token's, then one per proposal)
        decide which proposals it keeps and its own next token (`spec_decode.rejection`); the others sample
        their one row as in any step."""
        sizes = [1 + len(item.draft) for item in sampling]
        starts = list(itertools.accumulate(sizes, initial=0))
        n = len(sampling)
        kept: list[list[int]] = [[] for _ in sampling]
        kept_logprobs: list[list[tuple[float, dict[int, float] | None]]] = [[] for _ in sampling]
        result = SampleResult([0] * n, [None] * n, [0.0] * n, kept=kept, kept_logprobs=kept_logprobs)
        plain = [i for i, item in enumerate(sampling) if not item.draft]
        if plain:
            rows = torch.tensor([starts[i] for i in plain], device=logits.device)
            sampled = self.sampler(logits[rows], [sampling[i].seq for i in plain])
            for j, i in enumerate(plain):
                result.token_ids[i], result.logprobs[i] = sampled.token_ids[j], sampled.logprobs[j]
                result.sampled_logprobs[i] = sampled.sampled_logprobs[j]
        if any(item.draft and mask.constrained(item.seq) for item in sampling):
            self.sampler.bitmasks.wait()  # a fill under way reads the matchers that `constrained_rows` moves
        for i, item in enumerate(sampling):
            if not item.draft:
                continue
            seq, rows = item.seq, logits[starts[i] : starts[i + 1]]
            chosen = mask.constrained_rows(rows, seq, item.draft) if mask.constrained(seq) else rows
            if seq.params.greedy:  # the first maximum of each row, as the sampler takes it
                emitted = verify_greedy(first_max(chosen).tolist(), item.draft)
            else:
                probs = self.sampler.distribution(chosen.float(), [seq] * len(rows))
                probs /= probs.sum(dim=-1, keepdim=True)
                emitted = verify(probs, item.draft, generator=seq.generator or self.sampler.generator)
            kept[i], result.token_ids[i] = emitted[:-1], emitted[-1]
            kept_logprobs[i] = [(0.0, None)] * len(kept[i])  # (nobody asked)
            if seq.params.logprobs is not None:
                raw = torch.log_softmax(rows[: len(emitted)].float(), dim=-1)
                entries = [_logprob_entry(raw[j], token, seq.params.logprobs) for j, token in enumerate(emitted)]
                kept_logprobs[i] = list(entries[:-1])
                result.sampled_logprobs[i], result.logprobs[i] = entries[-1]
        return result

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the sampler picks from: the model's dtype unless the noise test aid needs float32."""
        if self.logit_noise is None:
            return self.model.compute_logits(hidden, float32=False)
        return self.logit_noise(self.model.compute_logits(hidden))

    def _decode_context(
        self, ctx: AttentionContext, decodes: list[ScheduledSeq], lens: list[int], first_row: int
    ) -> None:
        bs = self.block_size
        if self.native_decode:  # the C kernel reads the paged cache in place: block tables, no gathering
            ctx.decode_block_tables = self.block_tables.tensor(decodes, lens)
            ctx.decode_context_lens = torch.tensor(lens, dtype=torch.int32)
            return
        num_buckets = max(1, min(_MAX_DECODE_BUCKETS, len(decodes) // _MIN_DECODE_BUCKET))
        bounds = [len(decodes) * i // num_buckets for i in range(num_buckets + 1)]
        most = 0
        for lo, hi in itertools.pairwise(bounds):
            width = -(-max(lens[lo:hi]) // bs)  # the longest of the bucket
            flat: list[int] = []
            for s in decodes[lo:hi]:
                table = s.seq.block_table[:width]
                flat.extend(table)
                flat.extend([0] * (width - len(table)))
            keys = torch.arange(width * bs, device=self.device)
            bucket_lens = torch.tensor(lens[lo:hi], device=self.device)
            mask = (keys.unsqueeze(0) < bucket_lens.unsqueeze(1))[:, None, None, :]
            flat_t = torch.tensor(flat, dtype=torch.long, device=self.device)
            ctx.decode_buckets.append(DecodeBucket(first_row + lo, first_row + hi, width, flat_t, mask))
            most = max(most, len(flat))
        ctx.gather_buffers = self._gather_buffers(most)

    def _gather_buffers(self, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._gather is None or self._gather[0].shape[0] < num_blocks:
            shape = (num_blocks + num_blocks // 4, *self.kv_caches[0][0].shape[1:])  # headroom to grow into
            dtype = self.kv_caches[0][0].dtype
            self._gather = (torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype))
        return self._gather

    def _kernel_context(self, ctx: AttentionContext, inputs: StepInputs) -> None:
        lens = inputs.context_lens
        ctx.use_kernels = True
        ctx.max_context_len = max(lens)
        ctx.block_tables = self.block_tables.tensor(inputs.ordered, lens)
        ctx.context_lens = torch.tensor(lens, dtype=torch.int32, device=self.device)
        cu = [0, *itertools.accumulate(s.num_tokens for s in inputs.ordered)]
        ctx.cu_seqlens_q = torch.tensor(cu, dtype=torch.int32, device=self.device)

    # --- CUDA graphs for decode steps (folio.engine.cuda_graphs) -----------------------------------------

    @torch.inference_mode()
    def enable_decode_graphs(
        self, graph_factory: GraphFactory | None = None, max_batch_size: int | None = None
    ) -> None:
        """Capture the decode forward pass for batch sizes up to ``max_batch_size`` (default: max_decode_rows).

        Needs the kernel path (the graphs are `folio.kernels` launches). ``graph_factory`` defaults to real
        CUDA graphs; tests pass `EagerStepGraph` to run the same buffers and dispatch on the CPU.
        """
        from folio.engine.cuda_graphs import DecodeGraphs, cuda_graph_factory

        if not self.use_kernels:
            raise ValueError("decode graphs need the kernel path (use_kernels), which CUDA turns on")
        self.decode_graphs = None  # drop old graphs (and their memory) before capturing new ones
        self.decode_graphs = DecodeGraphs(
            lambda ids, pos, ctx: self.model(ids, pos, self.kv_caches, ctx),
            max_batch_size=max_batch_size or self.max_decode_rows,
            max_model_len=self.cfg.max_model_len,
            block_size=self.block_size,
            device=self.device,
            graph_factory=graph_factory or cuda_graph_factory(),
            lora=self.lora,
        )

    def _fits_decode_graphs(self, inputs: StepInputs) -> bool:
        """A step of single-token rows only (decodes, verify positions) that the graphs are captured for."""
        graphs = self.decode_graphs
        return graphs is not None and not inputs.prefills and 0 < len(inputs.ordered) <= graphs.max_batch_size

    def _graph_forward(self, inputs: StepInputs) -> torch.Tensor:
        """A decode-only step's hidden states (every row) through the captured graphs."""
        assert self.decode_graphs is not None and not inputs.prefills
        hidden = self.decode_graphs.run(  # host tensors: run() copies them into the graphs' static buffers
            torch.tensor(inputs.input_ids, dtype=torch.long),
            torch.tensor(inputs.positions, dtype=torch.long),
            torch.tensor(inputs.slots, dtype=torch.long),
            self.block_tables.host(inputs.ordered, inputs.context_lens),
            torch.tensor(inputs.context_lens, dtype=torch.int32),
            torch.tensor(inputs.lora_slots, dtype=torch.int32) if inputs.has_lora else None,
        )
        self.block_tables.sent()  # run() copied the pinned tables without blocking
        return hidden


def _logprob_entry(logprobs: torch.Tensor, token: int, top_n: int) -> tuple[float, dict[int, float]]:
    """A token's log-probability and its entry: itself and the row's top ``top_n``, as the sampler gives them."""
    own = float(logprobs[token])
    entry = {token: own}
    if top_n:
        values, ids = logprobs.topk(min(top_n, logprobs.shape[0]))
        entry.update(zip(ids.tolist(), values.tolist(), strict=True))
    return own, entry
