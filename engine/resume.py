"""Continuing a sequence after the output tokens a client already has (the router's continuation of an answer
on another replica, `folio.engine.server.continuation`), exactly as the uninterrupted run would go on.

`replay` runs those tokens through the same stop checks, detokenizer and `OutputText` as generation does
(`folio.engine.scheduler.check_stop`), so that the detokenizer's window, the stop-string lookback and the
text held back for a stop string are as they were; the text the client has of them is what `take` hands out
after them. `Sequence.resume` installs that state: the tokens become output tokens already sent, so the
remaining ``max_tokens`` budget, penalties and the seeded random stream carry on across the seam.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from folio.engine.output_text import OutputText
from folio.engine.sampling_params import SamplingParams
from folio.engine.scheduler import check_stop
from folio.engine.sequence import Sequence
from folio.engine.tokenizer.detokenizer import IncrementalDetokenizer

Finish = tuple[str, str | int | None]  # (finish reason, stop reason)


@dataclass
class Replay:
    """A sequence's text state after ``token_ids``, as the uninterrupted run had it after them."""

    prompt_token_ids: list[int]  # the prompt it was replayed after (the detokenizer's context)
    token_ids: list[int]
    detokenizer: IncrementalDetokenizer
    text: OutputText
    sent_text: str  # what the client has of their text (all of it once finished)
    finish: Finish | None  # how the tokens ended the sequence, if they did

    @property
    def finished(self) -> bool:
        return self.finish is not None


def max_total_tokens(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> int:
    """A sequence's cap on prompt + output tokens (`LLMEngine.add_request` caps sequences with it)."""
    return min(num_prompt_tokens + max_tokens, max_model_len)


def replay(
    tokenizer: Any,
    prompt_token_ids: list[int],
    params: SamplingParams,
    token_ids: list[int],
    *,
    eos_token_ids: frozenset[int],
    max_model_len: int,
) -> Replay:
    """Runs ``token_ids`` (output tokens, in order) through the stop checks and detokenizing of generation.
    Raises ValueError for tokens after the one that ended the sequence. CPU work linear in the tokens:
    callers on an event loop run it in a worker thread."""
    # logprobs, prompt logits: nothing of them is computed here
    quiet = replace(params, logprobs=None, prompt_logprobs=None, mean_prompt_logits=False)
    cap = max_total_tokens(len(prompt_token_ids), params.max_tokens, max_model_len)
    seq = Sequence("replay", None, prompt_token_ids, quiet, cap, eos_token_ids)
    seq.detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, params.skip_special_tokens)
    finish: Finish | None = None
    for i, token in enumerate(token_ids):
        if finish is not None:
            raise ValueError(f"token {i} comes after the choice finished ({finish[0]})")
        seq.token_ids.append(token)
        finish = check_stop(seq, token)
    # each output of the run took what was not held back; a finished one took the rest
    sent = seq.text.take(finish is not None)
    return Replay(list(prompt_token_ids), list(token_ids), seq.detokenizer, seq.text, sent, finish)
