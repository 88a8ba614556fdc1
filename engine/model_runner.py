"""Runs one scheduled step: builds the flat token batch and attention context, runs the model, samples."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import torch

from folio.engine.config import ModelConfig
from folio.engine.layers.context import AttentionContext, DecodeBucket, PrefillSegment
from folio.engine.models.base import DecoderLM
from folio.engine.sampler import Sampler, SampleResult
from folio.engine.scheduler import ScheduledSeq
from folio.kernels import decode_attention_cpu

if TYPE_CHECKING:
    from folio.engine.cuda_graphs import DecodeGraphs, GraphFactory

# Without the native kernel, CPU decode attention pads each sequence's keys to the longest in its batch;
# splitting the decodes into a few buckets of similar length cuts that padding at the cost of more calls.
_MAX_DECODE_BUCKETS = 16
_MIN_DECODE_BUCKET = 4


def block_table_tensor(items: list[ScheduledSeq], lens: list[int], block_size: int, device: torch.device) -> torch.Tensor:
    """The items' block tables as int32 ``[len(items), blocks of the longest context]``, padded with block 0
    (entries past a context are never read, so any valid id will do)."""
    width = -(-max(lens) // block_size)
    tables = [item.seq.block_table[:width] for item in items]
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * cfg.head_dim * elem


class ModelRunner:
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
        enforce_eager: bool = False,
    ) -> None:
        self.model = model
        self.cfg = cfg
        self.block_size = block_size
        self.device = device
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_hidden_layers)
        ]
        self.sampler = Sampler(seed, device)
        self.use_kernels = device.type == "cuda"
        model.use_kernels(self.use_kernels)
        if device.type == "cpu" and dtype == torch.float32:
            model.store_weights_for_cpu_float32()
        # CPU decode attention: the native kernel where this build has it, else gather + SDPA in buckets
        self.native_decode = device.type == "cpu" and decode_attention_cpu.supports(self.kv_caches[0][0])
        self._gather: tuple[torch.Tensor, torch.Tensor] | None = None
        self.max_num_seqs = max_num_seqs
        self.decode_graphs: DecodeGraphs | None = None
        if device.type == "cuda" and not enforce_eager and model.supports_cuda_graphs:
            self.enable_decode_graphs()

    @torch.inference_mode()
    def step(self, batch: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], SampleResult | None]:
        """Compute the scheduled tokens; return the sequences that got a new token and the sampling result."""
        if self._fits_decode_graphs(batch):
            return self._graph_decode_step(batch)
        prefills = [s for s in batch if s.num_tokens > 1]
        # decodes sorted by context length, so that length buckets are contiguous row ranges
        decodes = sorted((s for s in batch if s.num_tokens == 1), key=lambda s: s.seq.num_computed_tokens)
        ordered = prefills + decodes
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        bs = self.block_size
        segments: list[PrefillSegment] = []
        logit_rows: list[int] = []
        for item in ordered:
            seq, start = item.seq, item.seq.num_computed_tokens
            end = start + item.num_tokens
            row = len(input_ids)
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            if item.num_tokens > 1:
                blocks = None
                if start > 0:
                    blocks = torch.tensor(table[: -(-end // bs)], dtype=torch.long, device=self.device)
                segments.append(PrefillSegment(row, row + item.num_tokens, end, blocks))
            if item.samples:
                logit_rows.append(row + item.num_tokens - 1)
        num_prefill_tokens = sum(s.num_tokens for s in prefills)
        ctx = AttentionContext(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=self.device),
            prefills=segments,
            num_prefill_tokens=num_prefill_tokens,
            num_decodes=len(decodes),
        )
        if self.use_kernels:
            self._kernel_context(ctx, ordered)
        elif decodes:
            self._decode_context(ctx, decodes, num_prefill_tokens)

        ids = torch.tensor(input_ids, dtype=torch.long, device=self.device)
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)
        hidden = self.model(ids, pos, self.kv_caches, ctx)
        sampling = [s for s in ordered if s.samples]
        if not sampling:
            return [], None
        logits = self.model.compute_logits(hidden[torch.tensor(logit_rows, device=self.device)])
        return sampling, self.sampler(logits, [s.seq for s in sampling])

    def _decode_context(self, ctx: AttentionContext, decodes: list[ScheduledSeq], first_row: int) -> None:
        bs = self.block_size
        lens = [s.seq.num_computed_tokens + 1 for s in decodes]
        if self.native_decode:  # the C kernel reads the paged cache in place: block tables, no gathering
            ctx.decode_block_tables = block_table_tensor(decodes, lens, bs, self.device)
            ctx.decode_context_lens = torch.tensor(lens, dtype=torch.int32)
            return
        num_buckets = max(1, min(_MAX_DECODE_BUCKETS, len(decodes) // _MIN_DECODE_BUCKET))
        bounds = [len(decodes) * i // num_buckets for i in range(num_buckets + 1)]
        most = 0
        for lo, hi in itertools.pairwise(bounds):
            width = -(-lens[hi - 1] // bs)  # the longest of the bucket (lens ascend)
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

    def _kernel_context(self, ctx: AttentionContext, ordered: list[ScheduledSeq]) -> None:
        lens = [s.seq.num_computed_tokens + s.num_tokens for s in ordered]
        ctx.use_kernels = True
        ctx.max_context_len = max(lens)
        ctx.block_tables = block_table_tensor(ordered, lens, self.block_size, self.device)
        ctx.context_lens = torch.tensor(lens, dtype=torch.int32, device=self.device)
        cu = [0]
        for s in ordered:
            cu.append(cu[-1] + s.num_tokens)
        ctx.cu_seqlens_q = torch.tensor(cu, dtype=torch.int32, device=self.device)

    # --- CUDA graphs for decode steps (folio.engine.cuda_graphs) -----------------------------------------

    @torch.inference_mode()
    def enable_decode_graphs(
        self, graph_factory: GraphFactory | None = None, max_batch_size: int | None = None
    ) -> None:
        """Capture the decode forward pass for batch sizes up to ``max_batch_size`` (default: max_num_seqs).

        Needs the kernel path (the graphs are `folio.kernels` launches). ``graph_factory`` defaults to real
        CUDA graphs; tests pass `EagerStepGraph` to run the same buffers and dispatch on the CPU.
        """
        from folio.engine.cuda_graphs import DecodeGraphs, cuda_graph_factory

        if not self.use_kernels:
            raise ValueError("decode graphs need the kernel path (use_kernels), which CUDA turns on")
        self.decode_graphs = None  # drop old graphs (and their memory) before capturing new ones
        self.decode_graphs = DecodeGraphs(
            lambda ids, pos, ctx: self.model(ids, pos, self.kv_caches, ctx),
            max_batch_size=max_batch_size or self.max_num_seqs,
            max_model_len=self.cfg.max_model_len,
            block_size=self.block_size,
            device=self.device,
            graph_factory=graph_factory or cuda_graph_factory(),
        )

    def _fits_decode_graphs(self, batch: list[ScheduledSeq]) -> bool:
        graphs = self.decode_graphs
        return (
            graphs is not None
            and self.use_kernels
            and 0 < len(batch) <= graphs.max_batch_size
            and all(item.num_tokens == 1 for item in batch)
        )

    def _graph_decode_step(self, batch: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], SampleResult | None]:
        """A decode-only step through the captured graphs; logits and sampling run eagerly after them."""
        assert self.decode_graphs is not None
        bs = self.block_size
        decodes = sorted(batch, key=lambda s: s.seq.num_computed_tokens)  # the eager path's row order
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        lens: list[int] = []
        for item in decodes:
            seq, pos = item.seq, item.seq.num_computed_tokens
            input_ids.append(seq.token_ids[pos])
            positions.append(pos)
            slots.append(seq.block_table[pos // bs] * bs + pos % bs)
            lens.append(pos + 1)
        hidden = self.decode_graphs.run(  # host tensors: run() copies them into the graphs' static buffers
            torch.tensor(input_ids, dtype=torch.long),
            torch.tensor(positions, dtype=torch.long),
            torch.tensor(slots, dtype=torch.long),
            block_table_tensor(decodes, lens, bs, torch.device("cpu")),
            torch.tensor(lens, dtype=torch.int32),
        )
        rows = [i for i, item in enumerate(decodes) if item.samples]
        if not rows:  # a one-token prefill chunk that is not the prompt's last
            return [], None
        if len(rows) < len(decodes):
            hidden = hidden[torch.tensor(rows, device=self.device)]
        sampling = [decodes[i] for i in rows]
        logits = self.model.compute_logits(hidden)
        return sampling, self.sampler(logits, [s.seq for s in sampling])
