"""POST /v1/chat/completions: the tokenizer's chat template turns the messages into the prompt."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from folio.engine.server.choices import Choices, Piece, Prompt
from folio.engine.server.errors import bad_request
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
    Usage,
)
from folio.engine.server.serving import OpenAIServing, new_id


def render_prompt(serving: OpenAIServing, req: ChatCompletionRequest) -> Prompt:
    tok = serving.tokenizer
    if not getattr(tok, "chat_template", None):
        raise bad_request(
            "This model has no chat template; use /v1/completions.", param="messages",
            code=ErrorCode.UNSUPPORTED_PARAMETER,
        )  # fmt: skip
    # Templates know system/user/assistant; OpenAI's newer "developer" role means "system".
    conversation = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages
    ]
    try:
        text = tok.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=req.add_generation_prompt
        )
    except Exception as exc:  # a template may reject e.g. a role order it does not support
        raise bad_request(f"The chat template rejected the messages: {exc}", param="messages") from exc
    # The template already holds any BOS token.
    ids = serving.tokenize(text, add_special_tokens=False, param="messages")
    serving.check_token_ids(ids, "messages")
    return Prompt(ids, text)


async def create_chat_completion(
    serving: OpenAIServing, req: ChatCompletionRequest, raw: Request
) -> Response:
    serving.check_common(req)
    if req.tools:
        raise bad_request("tools are not supported.", param="tools", code=ErrorCode.UNSUPPORTED_PARAMETER)
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request(
            "Only response_format type 'text' is supported.", param="response_format",
            code=ErrorCode.UNSUPPORTED_PARAMETER,
        )  # fmt: skip
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true.", param="top_logprobs")
    serving.check_sequences(req.n)  # before the cost of rendering and tokenizing
    prompt = await serving.off_loop(render_prompt, serving, req)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    budget = serving.max_tokens(requested, None, len(prompt.token_ids), param=param, prompt_param="messages")
    top_k = (req.top_logprobs or 0) if req.logprobs else None
    request_id = new_id("chatcmpl")
    seqs = serving.sequences(request_id, [prompt], req, [budget], top_k)
    renderer = ChatRenderer(request_id, serving.config.served_model_name, serving.tokenizer, top_k)
    return await serving.respond(raw, req, seqs, Choices(seqs, [prompt], req.n), renderer)


class ChatRenderer:
    """Chat's wording: each choice's stream opens with the assistant role; the text is its content."""

    def __init__(self, request_id: str, model: str, tokenizer: Any, top_k: int | None) -> None:
        self.request_id, self.model, self.tokenizer, self.top_k = request_id, model, tokenizer, top_k
        self.created = int(time.time())

    def _logprobs(self, piece: Piece) -> ChatLogprobs | None:
        if self.top_k is None or piece.logprobs is None:
            return None
        return chat_logprobs(self.tokenizer, piece.token_ids, piece.logprobs, self.top_k)

    def _chunk(self, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.request_id, created=self.created, model=self.model, choices=choices)

    def opening(self, index: int) -> Iterator[ChatCompletionChunk]:
        yield self._chunk([ChatChunkChoice(index=index, delta=Delta(role="assistant", content=""))])

    def chunks(self, piece: Piece) -> Iterator[ChatCompletionChunk]:
        delta = Delta(content=piece.text or None)
        choice = ChatChunkChoice(
            index=piece.index, delta=delta, logprobs=self._logprobs(piece), finish_reason=piece.finish_reason
        )
        yield self._chunk([choice])

    def usage_chunk(self, usage: Usage) -> ChatCompletionChunk:
        last = self._chunk([])
        last.usage = usage
        return last

    def response(self, pieces: list[Piece], usage: Usage) -> ChatCompletionResponse:
        choices = [
            ChatChoice(
                index=p.index,
                message=AssistantMessage(content=p.text),
                logprobs=self._logprobs(p),
                finish_reason=p.finish_reason,
                stop_reason=p.stop_reason,
            )
            for p in pieces
        ]
        return ChatCompletionResponse(id=self.request_id, model=self.model, choices=choices, usage=usage)
