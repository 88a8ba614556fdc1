"""Pipeline parallelism: each stage a contiguous range of the decoder layers, activations passed on.

A world of T × P ranks: rank r is stage ``r // T`` and tensor-parallel rank ``r % T`` inside it, so a
stage's ranks sit side by side (on one node) and a tensor-parallel group never straddles stages. Stage 0
holds the embeddings, the last stage the final norm; the LM head stays on stage 0 (it is the embedding
itself for tied models), because rank 0 samples: the whole sampling path (grammars, logprobs, prompt
logits, seeds) keeps running where the sequences live. A step therefore goes round once: stage 0 embeds
and runs its layers, each stage hands its hidden state and residual to the next (tensor-parallel rank t
to rank t of the next stage: after the all-reduce every rank of a stage holds the whole of both), and
the last stage sends the normed rows that need logits back to stage 0.

Sends are asynchronous (`dist.isend`), so a stage is free for the next micro-batch as soon as it has
handed one on; `LLMEngine` keeps up to P batches in flight (`StepHandle`s), which is what lets the stages
work at once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from folio.engine.config import ModelConfig

if TYPE_CHECKING:
    from folio.engine.distributed.parallel_state import TensorParallelGroup


@dataclass(frozen=True)
class Layout:
    """Where a global rank sits in a T × P world."""

    tp_size: int
    pp_size: int

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def stage(self, rank: int) -> int:
        return rank // self.tp_size

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp_size

    def rank(self, stage: int, tp_rank: int) -> int:
        return stage * self.tp_size + tp_rank

    def stage_ranks(self, stage: int) -> list[int]:
        return [self.rank(stage, t) for t in range(self.tp_size)]


def stage_layers(cfg: ModelConfig, pp_size: int, stage: int) -> range:
    """The layers stage ``stage`` of ``pp_size`` runs. The stages take turns on each micro-batch, so the
    slowest sets the pace: stage 0 also computes the LM head (a step reads every weight once, so its cost
    is about its weights' size: SmolLM2's head weighs as much as 8 of its 30 layers), and gets that many
    fewer layers; the rest are shared evenly, the remainder one apiece to the last stages. Every stage keeps
    at least one layer."""
    layers = cfg.num_hidden_layers
    assert 0 <= stage < pp_size <= layers
    if pp_size == 1:
        return range(layers)
    head = cfg.vocab_size * cfg.hidden_size / _layer_weights(cfg)  # the head, in layers
    first = min(max(1, round((layers + head) / pp_size - head)), layers - (pp_size - 1))
    if stage == 0:
        return range(first)
    rest, later = layers - first, pp_size - 1
    base, extra = divmod(rest, later)
    i = stage - 1
    start = first + i * base + max(0, i - (later - extra))
    return range(start, start + base + (1 if i >= later - extra else 0))


def _layer_weights(cfg: ModelConfig) -> float:
    """A decoder layer's weights a token reads: attention's projections and the feed-forward block (a
    mixture of experts: the experts a token is routed to)."""
    hf = cfg.hf
    attention = cfg.hidden_size * cfg.head_dim * 2 * (cfg.num_attention_heads + cfg.num_key_value_heads)
    experts = getattr(hf, "num_experts_per_tok", None) if hf is not None else None
    moe_size = getattr(hf, "moe_intermediate_size", None) if hf is not None else None
    intermediate = experts * (moe_size or cfg.intermediate_size) if experts else cfg.intermediate_size
    return attention + 3 * cfg.hidden_size * intermediate


def check_pipelinable(cfg: ModelConfig, pp_size: int) -> None:
    """Refuse, before any process starts, more stages than the model has layers."""
    if pp_size > cfg.num_hidden_layers:
        raise ValueError(
            f"pipeline_parallel_size {pp_size} does not fit {cfg.architecture}: it has {cfg.num_hidden_layers} "
            "decoder layers, fewer than the stages"
        )


def stage_config(cfg: ModelConfig, layers: range) -> ModelConfig:
    """The model facts as a stage sees them: its layers (which size its KV cache)."""
    return replace(cfg, num_hidden_layers=len(layers))


class StageLink:
    """One rank's neighbours in the pipeline and the point-to-point transfers between them. Every transfer
    is marked in flight on ``group`` (as `send`/`recv`), so the watchdog tells a stalled peer from work."""

    def __init__(self, layout: Layout, rank: int, group: TensorParallelGroup, hidden_size: int,
                 dtype: torch.dtype, device: torch.device) -> None:  # fmt: skip
        self.layout, self.rank, self.group = layout, rank, group
        self.stage = layout.stage(rank)
        t = layout.tp_rank(rank)
        self.first, self.last = self.stage == 0, self.stage == layout.pp_size - 1
        self.prev = None if self.first else layout.rank(self.stage - 1, t)
        self.next = None if self.last else layout.rank(self.stage + 1, t)
        self.head = layout.rank(0, t)  # where the last stage's rows go: the logits are computed there
        self.tail = layout.rank(layout.pp_size - 1, t)
        self.hidden_size, self.dtype, self.device = hidden_size, dtype, device
        self._sending: deque[tuple[dist.Work, torch.Tensor]] = deque()  # a tensor lives until its send is done

    # --- between stages ---------------------------------------------------------------------------------

    def send_activations(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        assert self.next is not None and x.shape == residual.shape
        self._send(torch.stack((x, residual)), self.next)

    def recv_activations(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.prev is not None
        both = self._recv((2, num_tokens, self.hidden_size), self.prev)
        return both[0], both[1]

    # --- back to stage 0 ----------------------------------------------------------------------------------

    def send_output(self, hidden: torch.Tensor) -> None:
        """The last stage's normed rows, for stage 0's logits."""
        assert self.last and not self.first
        self._send(hidden.contiguous(), self.head)

    def recv_output(self, num_rows: int) -> torch.Tensor:
        assert self.first and not self.last
        return self._recv((num_rows, self.hidden_size), self.tail)

    # --- transfers ----------------------------------------------------------------------------------------

    def _send(self, tensor: torch.Tensor, dst: int) -> None:
        while self._sending and self._sending[0][0].is_completed():
            self._sending.popleft()
        with self.group.timed("send"):
            work = dist.isend(tensor, dst)
        self._sending.append((work, tensor))

    def _recv(self, shape: tuple[int, ...], src: int) -> torch.Tensor:
        tensor = torch.empty(shape, dtype=self.dtype, device=self.device)
        with self.group.timed("recv"):
            dist.recv(tensor, src)
        return tensor

    def flush(self) -> None:
        """Wait until every send has been taken (before the process group goes)."""
        while self._sending:
            self._sending.popleft()[0].wait()
