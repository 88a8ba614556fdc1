"""Runs one scheduled step: builds the flat token batch and attention context, runs the model, samples."""

from __future__ import annotations

import itertools

import torch

from folio.engine.config import ModelConfig
from folio.engine.layers.context import AttentionContext, DecodeBucket, PrefillSegment
from folio.engine.models.llama import LlamaForCausalLM
from folio.engine.sampler import Sampler, SampleResult
from folio.engine.scheduler import ScheduledSeq

# CPU decode attention pads each sequence's keys to the longest in its batch; splitting the decodes into
# a few buckets of similar length cuts that padding at the cost of a few more (cheap) calls.
_MAX_DECODE_BUCKETS = 16
_MIN_DECODE_BUCKET = 4


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * block_size * cfg.num_key_value_heads * cfg.head_dim * elem


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        cfg: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        seed: int,
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
        self._gather: tuple[torch.Tensor, torch.Tensor] | None = None

    @torch.inference_mode()
    def step(self, batch: list[ScheduledSeq]) -> tuple[list[ScheduledSeq], SampleResult | None]:
        """Compute the scheduled tokens; return the sequences that got a new token and the sampling result."""
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
        width = -(-max(lens) // self.block_size)
        tables = [s.seq.block_table[:width] + [0] * (width - len(s.seq.block_table[:width])) for s in ordered]
        ctx.use_kernels = True
        ctx.max_context_len = max(lens)
        ctx.block_tables = torch.tensor(tables, dtype=torch.int32, device=self.device)
        ctx.context_lens = torch.tensor(lens, dtype=torch.int32, device=self.device)
        cu = [0]
        for s in ordered:
            cu.append(cu[-1] + s.num_tokens)
        ctx.cu_seqlens_q = torch.tensor(cu, dtype=torch.int32, device=self.device)
