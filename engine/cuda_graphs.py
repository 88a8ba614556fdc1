"""CUDA graphs for decode steps: one captured forward pass per batch size, replayed over static buffers.

A decode step of a small model is mostly kernel-launch overhead: hundreds of small launches, each a few
microseconds of Python and driver time. A CUDA graph records those launches once and replays them with a
single call. A graph reads and writes fixed addresses, so `DecodeGraphs` owns static input buffers sized
for the largest captured batch; each step copies its inputs into them, pads the batch up to the nearest
captured size with harmless rows and replays that size's graph. Every graph attends with
``max_context_len = max_model_len`` (split-K is chosen from that bound), so one graph serves any context
length; the real lengths live in the ``context_lens`` buffer.

The graph itself sits behind `StepGraph` (capture a function once, replay it later): `CudaStepGraph` is the
real thing, `EagerStepGraph` re-runs the function on replay and is what the CPU tests use, so everything
but the capture itself (buffers, padding, size choice, the runner's dispatch) is exercised without a GPU.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from typing import Protocol

import torch

from folio.engine.layers.context import AttentionContext
from folio.engine.layers.lora import LoRAContext
from folio.kernels.layout import BLOCK_TABLE_DTYPE, CONTEXT_LENS_DTYPE, PAD_SLOT_ID

log = logging.getLogger(__name__)

# Larger decode batches run eagerly: there the launches are a small share of the step, and each size
# costs capture time and graph memory.
MAX_CAPTURED_BATCH = 512

# forward(input_ids [B], positions [B], ctx) -> hidden states [B, hidden]
Forward = Callable[[torch.Tensor, torch.Tensor, AttentionContext], torch.Tensor]


class StepGraph(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Record ``fn`` (which reads only static buffers); return its static output tensor."""
        ...

    def replay(self) -> None:
        """Run the recorded work again, refreshing the static output from the static inputs."""
        ...


GraphFactory = Callable[[], StepGraph]


class CudaStepGraph:
    """A `torch.cuda.CUDAGraph`; graphs made with the same ``pool`` share one memory pool."""

    def __init__(self, pool: object) -> None:
        self._graph = torch.cuda.CUDAGraph()
        self._pool = pool

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        with torch.cuda.graph(self._graph, pool=self._pool):
            return fn()

    def replay(self) -> None:
        self._graph.replay()


def cuda_graph_factory() -> GraphFactory:
    """CUDA graphs that share one memory pool: they never run at the same time, so their temporaries may
    overlap (each graph's output stays allocated, so no graph overwrites another's)."""
    pool = torch.cuda.graph_pool_handle()
    return lambda: CudaStepGraph(pool)


class EagerStepGraph:
    """Stand-in for a CUDA graph (CPU tests): replay re-runs the captured function into the same output
    tensor, so, as with a real graph, only what the static buffers hold reaches the result."""

    def __init__(self) -> None:
        self._fn: Callable[[], torch.Tensor] | None = None
        self._out: torch.Tensor | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self._fn, self._out = fn, fn()
        return self._out

    def replay(self) -> None:
        assert self._fn is not None and self._out is not None, "replay before capture"
        self._out.copy_(self._fn())


def capture_sizes(max_batch_size: int) -> list[int]:
    """Batch sizes to capture, as nano-vllm: 1, 2, 4, 8, then multiples of 16, and the largest batch
    itself (capped at ``MAX_CAPTURED_BATCH``) so every batch up to it has a graph."""
    largest = min(max_batch_size, MAX_CAPTURED_BATCH)
    if largest < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    base = [1, 2, 4, 8, *range(16, largest + 1, 16)]
    return [s for s in base if s < largest] + [largest]


class DecodeBuffers:
    """The static inputs a decode graph reads, sized for its largest batch; ``load`` copies a step's into
    their first rows. With ``lora``, each row's adapter slot too (-1: the base model)."""

    def __init__(
        self, max_batch_size: int, max_model_len: int, block_size: int, device: torch.device, *, lora: bool = False
    ) -> None:
        blocks_per_seq = -(-max_model_len // block_size)
        self.input_ids = torch.zeros(max_batch_size, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_batch_size, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_batch_size,), PAD_SLOT_ID, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(max_batch_size, blocks_per_seq, dtype=BLOCK_TABLE_DTYPE, device=device)
        self.context_lens = torch.ones(max_batch_size, dtype=CONTEXT_LENS_DTYPE, device=device)
        self.lora_slots = torch.full((max_batch_size,), -1, dtype=torch.int32, device=device) if lora else None

    def load(
        self,
        input_ids: torch.Tensor,  # [n] int64: each sequence's newest token
        positions: torch.Tensor,  # [n] int64: its position
        slot_mapping: torch.Tensor,  # [n] int64: the cache slot its K/V goes to
        block_tables: torch.Tensor,  # [n, w] int32, w <= cdiv(max_model_len, block_size)
        context_lens: torch.Tensor,  # [n] int32, this step's token included
        lora_slots: torch.Tensor | None = None,  # [n] int32: each row's adapter slot (None: all -1)
        *,
        pad_to: int | None = None,
    ) -> None:
        """Copies the step's n rows in; with ``pad_to``, rows n..pad_to become harmless padding."""
        n, width = input_ids.shape[0], block_tables.shape[1]
        # Pageable host memory: the copy is staged before it returns, so the sources may go right away.
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(slot_mapping, non_blocking=True)
        self.block_tables[:n, :width].copy_(block_tables, non_blocking=True)
        self.context_lens[:n].copy_(context_lens, non_blocking=True)
        if self.lora_slots is not None:  # every row, padding too: -1 adds nothing
            self.lora_slots.fill_(-1)
            if lora_slots is not None:
                self.lora_slots[:n].copy_(lora_slots, non_blocking=True)
        else:
            assert lora_slots is None, "adapter slots for graphs made without LoRA"
        if pad_to is not None and pad_to > n:
            # Padding rows: the KV store skips slot -1 (a stale slot would overwrite a live sequence's
            # cache); the other values only keep the padding's attention cheap and in bounds. Stale block
            # table entries are valid block ids, and one token of any block is a harmless read.
            self.input_ids[n:pad_to].zero_()
            self.positions[n:pad_to].zero_()
            self.slot_mapping[n:pad_to].fill_(PAD_SLOT_ID)
            self.context_lens[n:pad_to].fill_(1)


class DecodeGraphs:
    """Captured decode forward passes, one per batch size, and the static buffers they read.

    ``run`` takes a decode-only step (one new token per sequence) of at most ``max_batch_size``
    sequences and returns its hidden states; sampling stays outside the graphs.
    """

    def __init__(
        self,
        forward: Forward,
        *,
        max_batch_size: int,
        max_model_len: int,
        block_size: int,
        device: torch.device,
        graph_factory: GraphFactory,
        lora: bool = False,
    ) -> None:
        """``lora``: the model has adapter stacks (every graph runs their ops)."""
        if max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
        self.sizes = capture_sizes(max_batch_size)
        self.max_model_len = max_model_len
        self.buffers = DecodeBuffers(self.sizes[-1], max_model_len, block_size, device, lora=lora)
        self._graphs: dict[int, StepGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        start = time.perf_counter()
        # Largest first: it sets the shared pool's size, and the smaller graphs fit in what it freed.
        for size in reversed(self.sizes):
            ctx = self._context(size)

            def fn(size: int = size, ctx: AttentionContext = ctx) -> torch.Tensor:
                return forward(self.buffers.input_ids[:size], self.buffers.positions[:size], ctx)

            # All rows are padding here: the warm-up writes no KV, and it compiles the Triton kernels and
            # lets cuBLAS settle its workspace before the capture (neither may happen inside one).
            fn()
            graph = graph_factory()
            self._outputs[size] = graph.capture(fn)
            self._graphs[size] = graph
        log.info(
            "captured %d decode graphs (batch sizes %s) in %.1f s",
            len(self.sizes), ", ".join(map(str, self.sizes)), time.perf_counter() - start,
        )

    @property
    def max_batch_size(self) -> int:
        return self.sizes[-1]

    def size_for(self, num_seqs: int) -> int | None:
        """The smallest captured batch size that holds ``num_seqs`` sequences (None: too many)."""
        i = bisect.bisect_left(self.sizes, num_seqs)
        return self.sizes[i] if i < len(self.sizes) else None

    def _context(self, size: int) -> AttentionContext:
        b = self.buffers
        ctx = AttentionContext(
            slot_mapping=b.slot_mapping[:size],
            prefills=[],
            num_prefill_tokens=0,
            use_kernels=True,
            max_context_len=self.max_model_len,
            block_tables=b.block_tables[:size],
            context_lens=b.context_lens[:size],
        )
        if b.lora_slots is not None:  # captured with the LoRA ops: any mix of adapters replays
            ctx.lora = LoRAContext.for_graph(b.lora_slots[:size])
        return ctx

    @torch.inference_mode()  # the buffers are inference tensors (made under the runner's inference mode)
    def run(self, *step: torch.Tensor | None) -> torch.Tensor:
        """Hidden states [n, hidden] of one decode step, from its inputs as `DecodeBuffers.load` takes them
        (the adapter slots None for a base-model step). The result is a view of a static output: use it
        before the next ``run``."""
        assert step[0] is not None
        n = step[0].shape[0]
        size = self.size_for(n)
        if size is None or n == 0:
            raise ValueError(f"a decode step of {n} sequences has no captured graph (1..{self.max_batch_size})")
        self.buffers.load(*step, pad_to=size)
        self._graphs[size].replay()
        return self._outputs[size][:n]
