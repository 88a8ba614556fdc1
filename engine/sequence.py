"""One request's tokens and progress through the engine, and what it hands out at each step."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING, Any

from folio.engine.output_text import OutputText
from folio.engine.outputs import CompletionOutput, RequestOutput
from folio.engine.prompt_logits import PromptLogits
from folio.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch

    from folio.engine.lora.request import LoRARequest
    from folio.engine.resume import Replay
    from folio.engine.tokenizer.detokenizer import IncrementalDetokenizer


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


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
        lora_request: LoRARequest | None = None,
        cache_root: int | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.params = params
        self.prompt_token_ids: list[int] = list(prompt_token_ids)  # handed out with every output, never copied
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.max_total_tokens = max_total_tokens  # prompt + max_tokens, capped at max_model_len
        self.eos_token_ids = eos_token_ids
        self.status = SequenceStatus.WAITING
        self.group = request_id  # the client request this sequence is one of (fair queueing)
        self.round = 0  # its turn in the waiting queue: the scheduler keeps rounds non-decreasing there
        self.priority = 0  # its request's, under the priority policy: lower is served first
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.grammar: Any | None = None  # its matcher, when the answer is constrained (`folio.engine.structured`)
        self.block_serials: list[int] = []  # per leading full block: the serial its prefix is cached under
        self.text = OutputText(params.stop, params.include_stop_str_in_output)  # type: ignore[arg-type]
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.error: str | None = None  # why a step failed this sequence (finish reason "error")
        self.cumulative_logprob = 0.0
        self.arrival_time = time.monotonic()
        self.first_token_time: float | None = None
        self.generator: torch.Generator | None = None  # per-request RNG when params.seed is set
        self.detokenizer: IncrementalDetokenizer | None = None
        # what the next output hands out: tokens from num_sent_tokens on, and their top logprobs
        self.num_sent_tokens = self.num_prompt_tokens
        self._new_logprobs: list[dict[int, float]] | None = [] if params.logprobs is not None else None
        self.prompt_logits = PromptLogits.for_params(params, self.prompt_token_ids)  # None unless asked for
        self.lora_request = lora_request  # the adapter it runs under; None: the base model
        # the prefix cache's parent of its first block: None for the base model, a negative number per
        # adapter registration (block serials are positive), so no prefix is shared across adapters
        self.cache_root = cache_root
        self.lora_slot = -1  # its adapter's device slot while it holds a reference (from admission on)

    def __len__(self) -> int:
        return len(self.token_ids)

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

    def resume(self, replay: Replay) -> None:
        """Continue after output tokens a client already has (`folio.engine.resume`): they count as generated
        and sent, and the text state is the replay's. Their logprobs are the client's; ``cumulative_logprob``
        counts only the tokens generated here."""
        assert self.status is SequenceStatus.WAITING and self.num_output_tokens == 0, "resume a new sequence"
        assert not replay.finished, "a finished choice is not run again"
        assert replay.prompt_token_ids == self.prompt_token_ids, "replayed after another prompt"
        self.token_ids += replay.token_ids
        self.num_sent_tokens = len(self.token_ids)
        self.detokenizer, self.text = replay.detokenizer, replay.text

    def append_token(self, token: int, logprob: float, top: dict[int, float] | None, now: float) -> None:
        self.token_ids.append(token)
        self.cumulative_logprob += logprob
        if self._new_logprobs is not None and top is not None:
            self._new_logprobs.append(top)
        if self.first_token_time is None:
            self.first_token_time = now

    def detokenize(self, token: int) -> str | None:
        """Adds the text of a generated token; returns the stop string it completes, if any."""
        assert self.detokenizer is not None
        return self.text.add(self.detokenizer.add(token))

    def take_output(self) -> RequestOutput:
        """What the sequence gained since its last output (vLLM's ``RequestOutputKind.DELTA``): its new
        tokens and their logprobs, and the new text that can no longer be claimed by a stop string."""
        token_ids = self.token_ids[self.num_sent_tokens :]
        self.num_sent_tokens = len(self.token_ids)
        logprobs = self._new_logprobs
        if logprobs is not None:
            self._new_logprobs = []
        completion = CompletionOutput(
            index=0,
            text=self.text.take(self.is_finished),
            token_ids=token_ids,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            logprobs=logprobs,
            cumulative_logprob=self.cumulative_logprob if logprobs is not None else None,
        )
        output = RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=[completion],
            finished=self.is_finished,
            arrival_time=self.arrival_time,
            first_token_time=self.first_token_time,
            error=self.error,
            lora_request=self.lora_request,
        )
        if self.prompt_logits is not None and self.prompt_logits.complete:  # handed out once, with the first output
            output.prompt_logprobs = self.prompt_logits.logprobs
            output.prompt_logits_mean = self.prompt_logits.mean_logits
            self.prompt_logits = None
        return output
