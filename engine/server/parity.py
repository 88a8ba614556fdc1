"""POST /folio/v1/parity: Folio's own endpoint (outside the OpenAI surface) that the parity gate calls.

A prompt suite in (text prompts or chat messages; this replica applies its own tokenizer and chat
template, so a tokenizer or template change between revisions shows in the token ids). Per prompt out:
its token ids, the mean over its positions of the full logit vector (float32, little-endian, base64:
``numpy.frombuffer(base64.b64decode(s), "<f4")``) and the greedy continuation of ``maxTokens`` tokens.
The prompts run through the scheduler like any request, one sequence each, queued fairly with the
other clients' requests; the capacity checks and the 400/503 answers are those of the OpenAI endpoints.
"""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, model_validator

from folio.engine.rules import Bound, RuleError
from folio.engine.sampling_params import SamplingParams
from folio.engine.server.async_engine import EngineRequest
from folio.engine.server.chat import render_prompt
from folio.engine.server.choices import Prompt
from folio.engine.server.errors import OpenAIError, bad_request
from folio.engine.server.openai_errors import ErrorCode
from folio.engine.server.protocol import ChatCompletionRequest, ChatMessage, Text, _Request, _Response, ruled
from folio.engine.server.serving import OpenAIServing, new_id

PATH = "/folio/v1/parity"
LOGITS_ENCODING = "base64-float32-le"
MAX_PARITY_TOKENS = 256


class ParityPrompt(_Request):
    prompt: Text | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_of(self) -> ParityPrompt:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("each prompt needs exactly one of 'prompt' (text) or 'messages' (chat)")
        return self


class ParityRequest(_Request):
    model: Text | None = None
    prompts: list[ParityPrompt] = Field(..., min_length=1)
    maxTokens: ruled(int, "maxTokens", Bound(1, MAX_PARITY_TOKENS, integer=True)) = 16


class ParityResult(_Response):
    index: int
    promptTokenIds: list[int]
    meanLogits: str
    tokenIds: list[int]
    text: str
    finishReason: str | None = None


class ParityResponse(_Response):
    object: Literal["folio.parity"] = "folio.parity"
    model: str
    vocabSize: int
    logitsEncoding: Literal["base64-float32-le"] = LOGITS_ENCODING
    results: list[ParityResult]


def encode_logits(values: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(values, dtype="<f4").tobytes()).decode("ascii")


def decode_logits(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def _render(serving: OpenAIServing, prompts: list[ParityPrompt]) -> list[Prompt]:
    out = []
    for i, p in enumerate(prompts):
        if p.messages is not None:
            try:
                out.append(render_prompt(serving, ChatCompletionRequest(messages=p.messages)))
            except Exception as exc:
                raise _at(exc, i) from exc
            continue
        assert p.prompt is not None
        ids = serving.tokenize(p.prompt, add_special_tokens=True, param=f"prompts.{i}.prompt")
        serving.check_token_ids(ids, f"prompts.{i}.prompt")
        out.append(Prompt(ids, p.prompt))
    return out


def _at(exc: Exception, index: int) -> Exception:
    """A chat prompt's 400, naming which prompt of the suite it was."""
    if not isinstance(exc, (OpenAIError, RuleError)):
        return exc
    code = exc.code or ErrorCode.INVALID_VALUE
    return bad_request(f"prompts[{index}]: {exc.message}", param=f"prompts.{index}.messages", code=code)


async def create_parity(serving: OpenAIServing, req: ParityRequest, raw: Request) -> Response:
    lora = serving.check_model(req.model)  # an adapter's parity runs under it
    serving.check_sequences(len(req.prompts))
    prompts = await serving.off_loop(_render, serving, req.prompts)
    request_id = new_id("parity")
    seqs = []
    for i, prompt in enumerate(prompts):
        # a prompt near the context length gets the room that is left (a 400 only when none is)
        budget = serving.max_tokens(
            None, req.maxTokens, len(prompt.token_ids), param="maxTokens", prompt_param=f"prompts.{i}"
        )
        params = SamplingParams(temperature=0.0, max_tokens=budget, mean_prompt_logits=True)
        seqs.append(EngineRequest(f"{request_id}-{i}", prompt.token_ids, params, request_id, lora_request=lora))
    finals = await serving.run_to_end(raw, seqs)
    results = []
    for i, (seq, prompt) in enumerate(zip(seqs, prompts, strict=True)):
        out = finals[seq.request_id]
        mean = out.prompt_logits_mean
        assert mean is not None, "a parity sequence finished without its mean logits"
        completion = out.outputs[0]
        results.append(
            ParityResult(
                index=i,
                promptTokenIds=prompt.token_ids,
                meanLogits=encode_logits(mean.numpy()),
                tokenIds=completion.token_ids,
                text=completion.text,
                finishReason=completion.finish_reason,
            )
        )
    vocab = serving.vocab_size or (len(decode_logits(results[0].meanLogits)) if results else 0)
    body = ParityResponse(model=serving.model_name(lora), vocabSize=vocab, results=results)
    return JSONResponse(body.model_dump(mode="json"))
