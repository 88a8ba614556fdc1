"""Logits over a request's prompt: prompt log-probabilities (vLLM's ``prompt_logprobs``) and the mean of the
full logit vector over the prompt's positions (what the parity gate compares between two revisions).

A sequence that asks for either carries a `PromptLogits` collector. Each step, `collect` takes the hidden
states of every prompt position the step computed, turns them into logits in slices (so a 2,048-token chunk
never holds 2,048 × vocabulary floats at once) and folds them into the collector. Positions arrive in order
across prefill chunks; after a preemption the recompute starts over from position 0 and the positions
already collected are skipped. Such sequences never take their prompt from the prefix cache (the scheduler
checks `needs_prompt_logits`), so every position is computed, as vLLM does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from folio.engine.model_runner import StepInputs
    from folio.engine.sampling_params import SamplingParams

# prompt rows turned into logits at once: bounds the temporary [rows, vocab] float32 tensors
_ROWS_PER_SLICE = 256


class PromptPositions:
    """Which prompt positions a sequence has had the logits of: ``[0, next_position)``. On its own, a
    tensor-parallel worker's stand-in for a sequence's `PromptLogits`, rebuilt each step from rank 0's next
    position: `collect` then computes the same slices of logits on every rank (their vocabulary-parallel
    gather is a collective all ranks join) and keeps nothing."""

    def __init__(self, num_prompt_tokens: int, next_position: int = 0) -> None:
        self.num_prompt_tokens, self.next_position = num_prompt_tokens, next_position

    @property
    def complete(self) -> bool:
        return self.next_position == self.num_prompt_tokens

    def add(self, first_position: int, logits: torch.Tensor) -> None:
        """Take the logits [rows, vocab] of prompt positions ``first_position`` on."""
        assert first_position == self.next_position, "prompt positions must arrive in order"
        assert first_position + logits.shape[0] <= self.num_prompt_tokens
        self.next_position += logits.shape[0]


class PromptLogits(PromptPositions):
    """What one sequence has gathered over its prompt so far.

    ``logprobs[p]`` is the entry of prompt token p: its own log-probability given the tokens before it and
    the top ``k`` of that distribution (``None`` for token 0, which nothing predicts). ``mean_logits`` is
    the mean, over all prompt positions, of the logits each position yields (the last one's predicts the
    first generated token), float32 on the host.
    """

    def __init__(self, prompt_token_ids: list[int], top_k: int | None, want_mean: bool) -> None:
        super().__init__(len(prompt_token_ids))
        self.prompt_token_ids = prompt_token_ids
        self.top_k = top_k
        self.want_mean = want_mean
        self.logprobs: list[dict[int, float] | None] | None = [None] if top_k is not None else None
        self._sum: torch.Tensor | None = None

    @classmethod
    def for_params(cls, params: SamplingParams, prompt_token_ids: list[int]) -> PromptLogits | None:
        top_k = params.prompt_logprobs
        want_mean = params.mean_prompt_logits
        if top_k is None and not want_mean:
            return None
        return cls(prompt_token_ids, top_k, want_mean)

    @property
    def mean_logits(self) -> torch.Tensor | None:
        if self._sum is None or not self.complete:
            return None
        return (self._sum / self.num_prompt_tokens).cpu()

    def add(self, first_position: int, logits: torch.Tensor) -> None:
        """Fold in the float32 ``logits`` [rows, vocab] of prompt positions ``first_position`` on."""
        if self.want_mean:
            total = logits.sum(dim=0, dtype=torch.float32)
            self._sum = total if self._sum is None else self._sum + total
        if self.logprobs is not None:
            self._add_logprobs(first_position, logits)
        super().add(first_position, logits)  # checks the positions, then counts them collected

    def _add_logprobs(self, first_position: int, logits: torch.Tensor) -> None:
        assert self.logprobs is not None and self.top_k is not None
        # position p's logits predict prompt token p + 1; the last prompt position predicts no prompt token
        end = min(first_position + logits.shape[0], self.num_prompt_tokens - 1)
        count = end - first_position
        if count <= 0:
            return
        logprobs = torch.log_softmax(logits[:count], dim=-1)
        targets = torch.tensor(self.prompt_token_ids[first_position + 1 : end + 1], device=logits.device)
        own = logprobs.gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
        top_ids: list[list[int]] = [[] for _ in range(count)]
        top_vals: list[list[float]] = [[] for _ in range(count)]
        if self.top_k:
            vals, ids = logprobs.topk(min(self.top_k, logprobs.shape[1]), dim=-1)
            top_ids, top_vals = ids.tolist(), vals.tolist()
        for i, target in enumerate(targets.tolist()):
            entry = {target: own[i]}
            entry.update(zip(top_ids[i], top_vals[i], strict=True))
            self.logprobs.append(entry)


def needs_prompt_logits(seq: object) -> bool:
    """Whether a sequence still needs logits of prompt positions (and so must skip the prefix cache)."""
    collector = getattr(seq, "prompt_logits", None)
    return collector is not None and not collector.complete


def collect(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    inputs: StepInputs,
    noise: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """Feeds each collecting sequence of the step the logits of the prompt positions it computed.
    ``hidden`` has one row per token of ``inputs``, in its order; ``noise`` is the logit-noise fault."""
    row = 0
    for item in inputs.ordered:
        seq, start = item.seq, item.start
        first_row, row = row, row + item.num_tokens
        collector = getattr(seq, "prompt_logits", None)
        if collector is None or collector.complete:
            continue
        lo = max(start, collector.next_position)  # a recompute after preemption repeats collected positions
        hi = min(start + item.num_tokens, collector.num_prompt_tokens)
        assert lo == collector.next_position, "a prompt position was skipped"
        for a in range(lo, hi, _ROWS_PER_SLICE):
            b = min(a + _ROWS_PER_SLICE, hi)
            logits = compute_logits(hidden[first_row + a - start : first_row + b - start])
            collector.add(a, noise(logits) if noise is not None else logits)


def wanted(inputs: StepInputs) -> bool:
    return any(getattr(item.seq, "prompt_logits", None) is not None for item in inputs.ordered)


class LogitNoise:
    """The ``--fault-logit-noise STD`` test aid: Gaussian noise of standard deviation ``std`` on every logit
    the engine samples from or reports, from a generator of its own (the sampler's streams stay as they are).
    A revision with it fails no request and answers differently."""

    def __init__(self, std: float, seed: int, device: torch.device) -> None:
        assert std > 0
        self.std = std
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed + 0x5EED)

    @classmethod
    def create(cls, std: float, seed: int, device: torch.device) -> LogitNoise | None:
        return cls(std, seed, device) if std else None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(logits.shape, generator=self.generator, device=logits.device, dtype=logits.dtype)
        return logits + noise * self.std
