"""One request's tokens and progress through the engine."""

from __future__ import annotations

import enum
import itertools
import time
from typing import TYPE_CHECKING

from folio.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from folio.engine.tokenizer.detokenizer import IncrementalDetokenizer


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()


class Sequence:
    """Prompt + generated tokens, the KV blocks holding them, and how many are already computed.

    ``num_computed_tokens`` counts tokens whose K/V are in the cache. A preempted sequence drops its
    blocks and starts over from 0 ("recompute"): its generated tokens then act as prompt, so it
    continues with exactly the tokens it would have produced.
    """

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        max_total_tokens: int,
        eos_token_ids: frozenset[int],
    ) -> None:
        self.seq_id = next(_ids)
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_total_tokens = max_total_tokens  # prompt + max_tokens, capped at max_model_len
        self.eos_token_ids = eos_token_ids
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # hashes of the leading full blocks registered in the cache
        self.output_text = ""
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.generator: torch.Generator | None = None  # per-request RNG when params.seed is set
        self.detokenizer: IncrementalDetokenizer | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens
