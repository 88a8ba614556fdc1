"""What the engine hands back per request and step (the vLLM shape, ``RequestOutputKind.DELTA``).

Each step's output of a request carries only what is new since its previous output, so following a
stream costs time linear in its length. `merge_outputs` puts a request's outputs back together into the
whole answer (the offline `LLM.generate` and non-streaming responses).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from folio.engine.lora.request import LoRARequest
    from folio.engine.spec_decode.speculator import SpecDecodeStats


@dataclass
class CompletionOutput:
    """One generated sequence: in a step's output, the text and tokens new in that step. ``text`` never
    ends in a partial multi-byte character, nor in what might still become a stop string."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "error" | None while running
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    logprobs: list[dict[int, float]] | None = None  # one {token: logprob} per token of token_ids
    cumulative_logprob: float | None = None  # of every token so far

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    arrival_time: float = 0.0
    first_token_time: float | None = None  # monotonic seconds
    error: str | None = None  # set (with finish_reason "error") when a step failed this request
    # with SamplingParams.prompt_logprobs: one entry per prompt token, None for the first (in the first output)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    # with SamplingParams.mean_prompt_logits: [vocab] float32, the mean logits over the prompt's positions
    prompt_logits_mean: torch.Tensor | None = None
    lora_request: LoRARequest | None = None  # the adapter it ran under (vLLM's field); None: the base model


def merge_outputs(outputs: list[RequestOutput]) -> RequestOutput:
    """One request's step outputs, in order, as one output holding everything generated so far."""
    last = outputs[-1]
    parts = [o.outputs[0] for o in outputs]
    logprobs = None
    if last.outputs[0].logprobs is not None:
        logprobs = [entry for p in parts for entry in p.logprobs or ()]
    whole = dataclasses.replace(
        last.outputs[0],
        text="".join(p.text for p in parts),
        token_ids=[t for p in parts for t in p.token_ids],
        logprobs=logprobs,
    )
    first = outputs[0]  # the prompt's logits come with a request's first output
    return dataclasses.replace(
        last, outputs=[whole], prompt_logprobs=first.prompt_logprobs, prompt_logits_mean=first.prompt_logits_mean
    )


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of KV blocks in use, 0..1
    num_preemptions_total: int
    prefix_cache_queries_total: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits_total: int  # of those, tokens found cached
    spec_decode: SpecDecodeStats | None = None  # speculative decoding's counters, when it is on
