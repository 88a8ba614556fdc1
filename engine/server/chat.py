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
from folio.engine.server.serving import OpenAIServing, answered_as, new_id, resumable


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
    lora = serving.check_common(req)
    if req.tools:
        raise bad_request("tools are not supported.", param="tools", code=ErrorCode.UNSUPPORTED_PARAMETER)
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
    seqs = serving.sequences(request_id, [prompt], req, [budget], top_k, resumption=resumption, lora=lora)
    answer_id, created = answered_as(request_id, resumption)
    renderer = ChatRenderer(
        answer_id, serving.model_name(lora), serving.tokenizer, top_k,
        prompt_token_ids=prompt.token_ids if req.return_token_ids else None, created=created,
        # the client has the prompt's ids once it has any chunk of the answer
        prompt_sent=bool(resumption and resumption.carried),
    )  # fmt: skip
    choices = Choices(seqs, [prompt], req.n, resumption=resumption, records=resumable(raw))
    return await serving.respond(raw, req, seqs, choices, renderer)


class ChatRenderer:
    """Chat's wording: each choice's stream opens with the assistant role; the text is its content. With
    ``prompt_token_ids`` (``return_token_ids``), the first chunk and the response carry them and each choice
    its tokens."""

    def __init__(
        self, request_id: str, model: str, tokenizer: Any, top_k: int | None, *,
        prompt_token_ids: list[int] | None = None, created: int | None = None, prompt_sent: bool = False,
    ) -> None:  # fmt: skip
        self.request_id, self.model, self.tokenizer, self.top_k = request_id, model, tokenizer, top_k
        self.created = int(time.time()) if created is None else created
        self.prompt_token_ids = prompt_token_ids
        self._prompt_sent = prompt_sent

    def _logprobs(self, piece: Piece) -> ChatLogprobs | None:
        if self.top_k is None or piece.logprobs is None:
            return None
        return chat_logprobs(self.tokenizer, piece.token_ids, piece.logprobs, self.top_k)

    def _chunk(self, choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.request_id, created=self.created, model=self.model, choices=choices)

    def _token_ids(self, piece: Piece) -> list[int] | None:
        return piece.token_ids if self.prompt_token_ids is not None else None

    def opening(self, index: int) -> Iterator[ChatCompletionChunk]:
        chunk = self._chunk([ChatChunkChoice(index=index, delta=Delta(role="assistant", content=""))])
        if not self._prompt_sent:
            chunk.prompt_token_ids, self._prompt_sent = self.prompt_token_ids, True
        yield chunk

    def chunks(self, piece: Piece) -> Iterator[ChatCompletionChunk]:
        delta = Delta(content=piece.text or None)
        choice = ChatChunkChoice(
            index=piece.index, delta=delta, logprobs=self._logprobs(piece), finish_reason=piece.finish_reason,
            token_ids=self._token_ids(piece),
        )  # fmt: skip
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
                token_ids=self._token_ids(p),
            )
            for p in pieces
        ]
        return ChatCompletionResponse(
            id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage,
            prompt_token_ids=self.prompt_token_ids,
        )  # fmt: skip
