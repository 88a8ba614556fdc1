"""POST /v1/chat/completions: the tokenizer's chat template turns the messages into the prompt."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from folio.engine.rules import RuleError
from folio.engine.server import tool_calling
from folio.engine.server.choices import Choices, Piece, Prompt
from folio.engine.server.errors import bad_request, rejected
from folio.engine.server.logprobs import chat_logprobs
from folio.engine.server.openai_errors import ErrorCode
from folio.engine.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    Delta,
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCallOut,
    ToolCallOut,
    Usage,
)
from folio.engine.server.serving import OpenAIServing, answered_as, new_id, resumable
from folio.engine.server.tool_calling import Stream, ToolPlan
from folio.engine.tools.calls import CallDelta, call_id, merge_calls


def render_prompt(serving: OpenAIServing, req: ChatCompletionRequest) -> Prompt:
    tok = serving.tokenizer
    if not getattr(tok, "chat_template", None):
        raise bad_request(
            "This model has no chat template; use /v1/completions.", param="messages",
            code=ErrorCode.UNSUPPORTED_PARAMETER,
        )  # fmt: skip
    try:
        conversation = tool_calling.template_messages(req.messages)
    except RuleError as exc:
        raise rejected(exc) from exc
    tools = tool_calling.template_tools(req)
    try:
        text = tok.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=req.add_generation_prompt,
            **({"tools": tools} if tools else {}),
        )  # fmt: skip
    except Exception as exc:  # a template may reject e.g. a role order it does not support
        raise bad_request(f"The chat template rejected the messages: {exc}", param="messages") from exc
    # The template already holds any BOS token.
    ids = serving.tokenize(text, add_special_tokens=False, param="messages")
    serving.check_token_ids(ids, "messages")
    return Prompt(ids, text)


async def create_chat_completion(
    serving: OpenAIServing, req: ChatCompletionRequest, raw: Request
) -> Response:
    lora = serving.check_common(req)
    try:
        tools = tool_calling.plan(req, serving.tool_parser)
    except RuleError as exc:
        raise rejected(exc) from exc
    if tools is not None and tools.parser is not None and not tools.parser.skip_special_tokens:
        req.skip_special_tokens = False  # the format's markers are special tokens: the text must keep them
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true.", param="top_logprobs")
    serving.check_sequences(req.n)  # before the cost of rendering and tokenizing
    await serving.compile_constraint(req)
    prompt = await serving.off_loop(render_prompt, serving, req)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    budget = serving.max_tokens(requested, None, len(prompt.token_ids), param=param, prompt_param="messages")
    top_k = (req.top_logprobs or 0) if req.logprobs else None
    request_id = new_id("chatcmpl")
    resumption = await serving.resumption(req, [prompt], [budget], top_k)
    seqs = serving.sequences(request_id, [prompt], req, [budget], top_k, resumption=resumption, lora=lora,
                             priority=serving.priority(req, raw))
    answer_id, created = answered_as(request_id, resumption)
    renderer = ChatRenderer(
        answer_id, serving.model_name(lora), serving.tokenizer, top_k,
        prompt_token_ids=prompt.token_ids if req.return_token_ids else None, created=created,
        # the client has the prompt's ids once it has any chunk of the answer
        prompt_sent=bool(resumption and resumption.carried), tools=tools,
        carried={i: c.text for i, c in resumption.carried.items()} if resumption else None,
    )  # fmt: skip
    choices = Choices(seqs, [prompt], req.n, resumption=resumption, records=resumable(raw))
    return await serving.respond(raw, req, seqs, choices, renderer)


class ChatRenderer:
    """Chat's wording: each choice's stream opens with the assistant role; the text is its content. With
    ``prompt_token_ids`` (``return_token_ids``), the first chunk and the response carry them and each choice
    its tokens. With ``tools`` (`tool_calling.ToolPlan`), each choice's text goes through its reader: the
    calls it finds are said as ``tool_calls`` (name first, then arguments by fragments), and an answer that
    made calls finishes with ``"tool_calls"``. ``carried``: the text a continuation's client already has of
    each choice, which the readers take in again without saying it."""

    def __init__(
        self, request_id: str, model: str, tokenizer: Any, top_k: int | None, *,
        prompt_token_ids: list[int] | None = None, created: int | None = None, prompt_sent: bool = False,
        tools: ToolPlan | None = None, carried: dict[int, str] | None = None,
    ) -> None:  # fmt: skip
        self.request_id, self.model, self.tokenizer, self.top_k = request_id, model, tokenizer, top_k
        self.created = int(time.time()) if created is None else created
        self.prompt_token_ids = prompt_token_ids
        self._prompt_sent = prompt_sent
        self.tools = tools
        self._streams: dict[int, Stream] = {}
        for index, text in (carried or {}).items():
            if (stream := self._stream(index)) is not None:
                stream.feed(text)

    def _stream(self, index: int) -> Stream | None:
        if self.tools is None:
            return None
        if index not in self._streams:
            stream = self.tools.stream()
            if stream is None:
                return None
            self._streams[index] = stream
        return self._streams[index]

    def _logprobs(self, piece: Piece) -> ChatLogprobs | None:
        if self.top_k is None or piece.logprobs is None:
            return None
        return chat_logprobs(self.tokenizer, piece.token_ids, piece.logprobs, self.top_k)

    def _chunk(self, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.request_id, created=self.created, model=self.model, choices=choices)

    def _token_ids(self, piece: Piece) -> list[int] | None:
        return piece.token_ids if self.prompt_token_ids is not None else None

    def _call_id(self, choice: int, call: int) -> str:
        assert self.tools is not None
        prefix, length = self.tools.id_form
        return call_id(self.request_id, choice, call, length=length, prefix=prefix)

    def opening(self, index: int) -> Iterator[ChatCompletionChunk]:
        chunk = self._chunk([ChatChunkChoice(index=index, delta=Delta(role="assistant", content=""))])
        if not self._prompt_sent:
            chunk.prompt_token_ids, self._prompt_sent = self.prompt_token_ids, True
        yield chunk

    def chunks(self, piece: Piece) -> Iterator[ChatCompletionChunk]:
        finish = piece.finish_reason
        stream = self._stream(piece.index)
        if stream is None:
            delta = Delta(content=piece.text or None)
        else:  # a chunk even when the reader holds everything back: it carries the piece's tokens
            said = stream.feed(piece.text, final=finish is not None)
            calls = [self._delta_call(piece.index, c) for c in said.calls]
            delta = Delta(content=said.content or None, tool_calls=calls or None)
            finish = _finish_reason(finish, stream.num_calls)
        choice = ChatChunkChoice(
            index=piece.index, delta=delta, logprobs=self._logprobs(piece), finish_reason=finish,
            token_ids=self._token_ids(piece),
        )  # fmt: skip
        yield self._chunk([choice])

    def _delta_call(self, choice: int, d: CallDelta) -> DeltaToolCall:
        if d.name is None:
            return DeltaToolCall(index=d.index, function=DeltaFunctionCall(arguments=d.arguments))
        return DeltaToolCall(
            index=d.index, id=self._call_id(choice, d.index), type="function",
            function=DeltaFunctionCall(name=d.name, arguments=d.arguments),
        )  # fmt: skip

    def usage_chunk(self, usage: Usage) -> ChatCompletionChunk:
        last = self._chunk([])
        last.usage = usage
        return last

    def _message(self, piece: Piece) -> tuple[AssistantMessage, str | None]:
        stream = self.tools.stream() if self.tools is not None else None
        if stream is None:
            return AssistantMessage(content=piece.text), piece.finish_reason
        said = stream.feed(piece.text, final=True)
        calls = [
            ToolCallOut(id=self._call_id(piece.index, i), function=FunctionCallOut(name=c.name, arguments=c.arguments))
            for i, c in enumerate(merge_calls(said.calls))
        ]
        if not calls:
            return AssistantMessage(content=said.content), piece.finish_reason
        message = AssistantMessage(content=said.content or None, tool_calls=calls)
        return message, _finish_reason(piece.finish_reason, len(calls))

    def response(self, pieces: list[Piece], usage: Usage) -> ChatCompletionResponse:
        choices = []
        for p in pieces:
            message, finish = self._message(p)
            choices.append(ChatChoice(
                index=p.index, message=message, logprobs=self._logprobs(p), finish_reason=finish,
                stop_reason=p.stop_reason, token_ids=self._token_ids(p),
            ))  # fmt: skip
        return ChatCompletionResponse(
            id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage,
            prompt_token_ids=self.prompt_token_ids,
        )  # fmt: skip


def _finish_reason(finish: str | None, num_calls: int) -> str | None:
    """An answer that made calls and ended on its own finishes with "tool_calls", as OpenAI's."""
    return "tool_calls" if finish == "stop" and num_calls else finish
