"""Request and response bodies of the OpenAI-compatible API (the subset Folio serves).

Unknown request fields are ignored, as OpenAI's and vLLM's servers do, so newer clients keep working.
Every range is checked here, against the one table of bounds in `folio.engine.rules` that `SamplingParams`
also checks, so that a bad value is a 400 naming the parameter, in the same words as the offline API's
ValueError, before the engine sees it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from folio.engine import rules
from folio.engine.rules import BOUNDS, MAX_TOKENS_WITH_ECHO, Bound


@dataclass(frozen=True)
class Rule:
    """Field metadata: once the value has its type, check it against ``bound`` (a `RuleError` on failure,
    which the error handler answers with the rule's own message), and show the bound in the OpenAPI schema."""

    name: str
    bound: Bound

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {**handler(schema), **self.bound.json_schema()}

    def _check(self, value: Any) -> Any:
        return self.bound.check(self.name, value)


def ruled(kind: type, name: str, bound: Bound | None = None) -> Any:
    """``kind`` checked against the bound of ``name`` in the rules' table (or ``bound``)."""
    return Annotated[kind, Rule(name, bound or BOUNDS[name])]


def _stop(stop: Any) -> Any:
    rules.check_stop(stop)
    return stop


def _stop_token_ids(ids: list[int] | None) -> list[int] | None:
    return None if ids is None else rules.check_token_ids("stop_token_ids", ids)


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


class ResumeChoice(_Request):
    """What the client has of one choice (`folio.engine.server.continuation`)."""

    index: Annotated[int, Field(ge=0)]
    token_ids: list[int] = Field(default_factory=list)
    finish_reason: Literal["stop", "length", "abort"] | None = None
    stop_reason: str | int | None = None
    logprobs: list[list[tuple[int, float]]] | None = None  # per token: [[token_id, logprob], ...]
    prompt_logprobs: list[list[tuple[int, float]] | None] | None = None


class FolioResume(_Request):
    """Folio's own (`folio.engine.server.continuation.RESUME_FIELD`): continue an answer begun elsewhere."""

    id: Text
    created: int
    choices: list[ResumeChoice] = Field(default_factory=list)


class JsonSchemaFormat(_Request):
    name: Text = Field("response", max_length=64)
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Request):
    """vLLM's request field (its current form): exactly one of these."""

    json_: dict[str, Any] | Text | None = Field(None, alias="json")
    regex: Text | None = None
    choice: list[Text] | None = None
    grammar: Text | None = None
    json_object: bool | None = None


class SamplingRequest(_Request):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: Text | None = Field(None, description="The served model name; defaults to the one model served.")
    n: ruled(int, "n") = Field(1, description="Choices to generate per prompt (at most --max-n).")
    temperature: ruled(float, "temperature") | None = None
    top_p: ruled(float, "top_p") | None = None
    top_k: ruled(int, "top_k") | None = Field(
        None, description="vLLM extension; -1 or 0 disables it, as does any k >= the vocabulary."
    )
    min_p: ruled(float, "min_p") | None = Field(None, description="vLLM extension.")
    max_tokens: ruled(int, "max_tokens") | None = None
    stop: Annotated[Text | list[Text] | None, AfterValidator(_stop)] = Field(
        None, description=f"Strings that end the generation (at most {rules.MAX_STOP_STRINGS})."
    )
    seed: ruled(int, "seed") | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: ruled(float, "presence_penalty") = 0.0
    frequency_penalty: ruled(float, "frequency_penalty") = 0.0
    repetition_penalty: ruled(float, "repetition_penalty") = Field(1.0, description="vLLM extension.")
    ignore_eos: bool = Field(False, description="vLLM extension: keep generating past end-of-sequence.")
    stop_token_ids: Annotated[list[int] | None, AfterValidator(_stop_token_ids)] = Field(
        None, description="vLLM extension."
    )
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logit_bias: dict[str, float] | None = Field(
        None, description="Token id (as a string) -> a bias from -100 to 100 added to its logit."
    )
    response_format: ResponseFormat | None = Field(None, description="json_object, or json_schema with its schema.")
    structured_outputs: StructuredOutputs | None = Field(None, description="vLLM extension.")
    guided_json: dict[str, Any] | Text | None = Field(None, description="vLLM's older form of structured_outputs.")
    guided_regex: Text | None = Field(None, description="vLLM's older form of structured_outputs.")
    guided_choice: list[Text] | None = Field(None, description="vLLM's older form of structured_outputs.")
    guided_grammar: Text | None = Field(None, description="vLLM's older form of structured_outputs.")
    user: str | None = None
    priority: int = Field(
        0, ge=-(2**31), le=2**31 - 1,
        description="vLLM extension: lower is served first (needs --scheduling-policy priority; else only 0).",
    )  # fmt: skip
    return_token_ids: bool = Field(
        False, description="vLLM extension: the prompt's and each choice's token ids in the answer."
    )
    folio_resume: FolioResume | None = Field(
        None, description="Folio's router only: continue an answer another replica began."
    )
    # the request's structured-output constraint, once worked out (`folio.engine.server.structured`)
    _constraint: tuple[Any] | None = PrivateAttr(None)


class CompletionRequest(SamplingRequest):
    prompt: Text | list[Text] | list[int] | list[list[int]] = Field(
        ..., description="A string, a list of strings, a list of token ids or a list of such lists."
    )
    logprobs: ruled(int, "logprobs") | None = None
    echo: bool = Field(
        False, description="Prepend the prompt to each choice's text (and, with logprobs, the prompt's logprobs)."
    )
    max_tokens: ruled(int, "max_tokens", MAX_TOKENS_WITH_ECHO) | None = Field(
        None, description="0 is allowed with echo."
    )
    best_of: ruled(int, "best_of", BOUNDS["n"]) | None = Field(None, description="Only best_of == n is supported.")
    suffix: str | None = Field(None, description="Not supported: must be empty.")


class TextPart(_Request):
    type: Literal["text"]
    text: Text


class FunctionCallIn(_Request):
    name: Text
    arguments: Text = Field(..., description="JSON text of an object, as the answer carried it.")


class ToolCallIn(_Request):
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallIn] | None = Field(None, description="An assistant turn's calls.")
    tool_call_id: Text | None = Field(None, description="A tool turn's answer: the call it answers.")

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDefinition(_Request):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(None, description="A JSON Schema of the arguments (an object).")
    strict: bool | None = None


class ChatTool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: Text


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: ruled(int, "max_completion_tokens", BOUNDS["max_tokens"]) | None = None
    logprobs: bool = False
    top_logprobs: ruled(int, "top_logprobs", BOUNDS["logprobs"]) | None = None
    tools: list[ChatTool] | None = Field(None, description="Functions the model may call.")
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description='"auto" (the default with tools; needs --enable-auto-tool-choice), "none", '
        '"required", or a function to call.'
    )
    parallel_tool_calls: bool = Field(True, description="False: one call at most.")
    add_generation_prompt: bool = Field(True, description="vLLM extension.")


# ---------------------------------------------------------------- responses


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Extended(_Response):
    """A response part with extension fields that are left out while None, so that an answer that asks
    for none of them is the plain OpenAI one (fields that are null in OpenAI's shape stay)."""

    _omit_none: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    # no return annotation: the JSON schema stays the model's own
    def _without_unset_extensions(self, handler: SerializerFunctionWrapHandler):
        data = handler(self)
        for name in self._omit_none:
            if data.get(name, 0) is None:
                del data[name]
        return data


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


class CompletionChoice(_Extended):
    _omit_none = ("prompt_token_ids", "token_ids")

    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort"] | None = None
    stop_reason: str | int | None = None
    prompt_token_ids: list[int] | None = Field(None, description="With return_token_ids (vLLM extension).")
    token_ids: list[int] | None = Field(None, description="With return_token_ids (vLLM extension).")


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


class FunctionCallOut(_Response):
    name: str
    arguments: str


class ToolCallOut(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class AssistantMessage(_Extended):
    _omit_none = ("tool_calls",)

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(_Extended):
    _omit_none = ("token_ids",)

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort", "tool_calls"] | None = None
    stop_reason: str | int | None = None
    token_ids: list[int] | None = Field(None, description="With return_token_ids (vLLM extension).")


class ChatCompletionResponse(_Extended):
    _omit_none = ("prompt_token_ids",)

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = Field(None, description="With return_token_ids (vLLM extension).")


class DeltaFunctionCall(_Extended):
    _omit_none = ("name",)

    name: str | None = None
    arguments: str = ""


class DeltaToolCall(_Extended):
    """A piece of one call: its first names it (with its id); the next carry fragments of its arguments."""

    _omit_none = ("id", "type")

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class Delta(_Extended):
    _omit_none = ("tool_calls",)

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatChunkChoice(_Extended):
    _omit_none = ("token_ids",)

    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: Literal["stop", "length", "abort", "tool_calls"] | None = None
    token_ids: list[int] | None = None


class ChatCompletionChunk(_Extended):
    _omit_none = ("prompt_token_ids",)

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "folio"
    root: str
    max_model_len: int
    parent: str | None = Field(None, description="An adapter's base model (its served name); None for the base.")
    revision: str | None = Field(None, description="The pinned model revision (e.g. a 40-hex commit).")
    digest: str | None = Field(
        None, description="The sha256 content digest the weights (or the adapter's files) were verified against."
    )


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoadLoRAAdapterRequest(_Request):
    """POST /v1/load_lora_adapter, vLLM's fields."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    digest: str | None = Field(None, description="Folio's: sha256:… the adapter's files must match (`folio digest`).")
    served_name: str | None = Field(
        None, min_length=1,
        description="Folio's: the `model` answers name (default lora_name); Folio loads each adapter revision as "
        "NAME@REVISION and has it answer as NAME, so that clients never see which revision answered.",
    )  # fmt: skip


class UnloadLoRAAdapterRequest(_Request):
    """POST /v1/unload_lora_adapter, vLLM's fields (its ``lora_int_id`` is ignored: names identify adapters)."""

    lora_name: str = Field(min_length=1)

