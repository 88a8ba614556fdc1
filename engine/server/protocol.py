"""Request and response bodies of the OpenAI-compatible API (the subset Folio serves).

Unknown request fields are ignored, as OpenAI's and vLLM's servers do, so newer clients keep working.
Range checks live here so that a bad value is a 400 naming the parameter, before the engine sees it.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# Largest values the engine is asked to handle; beyond them a request is rejected, not clamped.
MAX_LOGPROBS = 20
INT64_MAX = 2**63 - 1
# JSON integers are unbounded; the sampler's tensors are int64. Every integer field is bounded to that
# range here, so an extreme value is a 400 naming the field instead of an overflow inside a step.
Seed = Annotated[int, Field(ge=-(2**63), le=INT64_MAX)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]


def _unicode(text: str) -> str:
    # JSON may carry lone surrogates ("\ud800"); they cannot be tokenized or encoded back as UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid Unicode text (it holds a lone surrogate)") from exc
    return text


Text = Annotated[str, AfterValidator(_unicode)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False


class SamplingRequest(_Request):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: Text | None = Field(None, description="The served model name; defaults to the one model served.")
    n: int = Field(1, ge=1, le=INT64_MAX, description="Choices to generate per prompt (at most --max-n).")
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(
        None, ge=-1, le=INT64_MAX, description="vLLM extension; -1 or 0 disables it, as does any k >= the vocabulary."
    )
    min_p: float | None = Field(None, ge=0, le=1, description="vLLM extension.")
    max_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    stop: Text | list[Text] | None = Field(None, description="Strings that end the generation (at most 16).")
    seed: Seed | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=10, description="vLLM extension.")
    ignore_eos: bool = Field(False, description="vLLM extension: keep generating past end-of-sequence.")
    stop_token_ids: list[TokenId] | None = Field(None, description="vLLM extension.")
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logit_bias: dict[str, float] | None = Field(None, description="Not supported: must be empty.")
    user: str | None = None


class CompletionRequest(SamplingRequest):
    prompt: Text | list[Text] | list[int] | list[list[int]] = Field(
        ..., description="A string, a list of strings, a list of token ids or a list of such lists."
    )
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = Field(
        False, description="Prepend the prompt to each choice's text (and, with logprobs, the prompt's logprobs)."
    )
    max_tokens: int | None = Field(None, ge=0, le=INT64_MAX, description="0 is allowed with echo.")
    best_of: int | None = Field(None, ge=1, le=INT64_MAX, description="Only best_of == n is supported.")
    suffix: str | None = Field(None, description="Not supported: must be empty.")


class TextPart(_Request):
    type: Literal["text"]
    text: Text


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(_Request):
    type: str = "text"


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=INT64_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = Field(None, description="Not supported: must be empty.")
    add_generation_prompt: bool = Field(True, description="vLLM extension.")


# ---------------------------------------------------------------- responses


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _now() -> int:
    return int(time.time())


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(_Response):
    """The legacy completions logprobs shape."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None
    stop_reason: str | int | None = None


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Response):
    content: list[TokenLogprob]


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None
    stop_reason: str | int | None = None


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Response):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None


class ChatCompletionChunk(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "folio"
    root: str
    max_model_len: int
    revision: str | None = Field(None, description="The pinned model revision (e.g. a 40-hex commit).")
    digest: str | None = Field(
        None, description="The sha256 content digest the weights were verified against."
    )


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Response):
    error: ErrorDetail
