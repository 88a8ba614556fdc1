"""POST /v1/completions."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from folio.engine import rules
from folio.engine.server.choices import Choices, Piece, Prompt
from folio.engine.server.errors import bad_request
from folio.engine.server.logprobs import completion_logprobs, joined, prompt_logprobs
from folio.engine.server.openai_errors import ErrorCode
from folio.engine.server.protocol import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    Usage,
)
from folio.engine.server.serving import OpenAIServing, answered_as, new_id, resumable

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint
MAX_PROMPTS = 64


def _prompts(serving: OpenAIServing, prompt: str | list[str] | list[int] | list[list[int]]) -> list[Prompt]:
    if isinstance(prompt, str):
        prompt = [prompt]
    rules.check_not_empty(prompt)
    if len(prompt) > MAX_PROMPTS and not isinstance(prompt[0], int):
        raise bad_request(f"At most {MAX_PROMPTS} prompts per request, got {len(prompt)}.", param="prompt")
    if isinstance(prompt[0], int):
        prompt = [prompt]  # type: ignore[list-item]
    out = []
    for p in prompt:
        if isinstance(p, str):
            ids = serving.tokenize(p, add_special_tokens=True, param="prompt")
            out.append(Prompt(ids, p))
        else:
            ids = list(p)
            out.append(Prompt(ids, None))
        serving.check_token_ids(ids, "prompt")
    return out


async def create_completion(serving: OpenAIServing, req: CompletionRequest, raw: Request) -> Response:
    lora = serving.check_common(req)
    if req.suffix:
        raise bad_request("suffix is not supported.", param="suffix", code=ErrorCode.UNSUPPORTED_PARAMETER)
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request(
            "best_of must equal n (no server-side ranking).", param="best_of", code=ErrorCode.UNSUPPORTED_PARAMETER
        )
    if req.max_tokens == 0 and not req.echo:
        raise bad_request("max_tokens 0 is only allowed with echo (the prompt's logprobs).", param="max_tokens")
    num_prompts = 1 if isinstance(req.prompt, str) or (req.prompt and isinstance(req.prompt[0], int)) else len(req.prompt)
    serving.check_sequences(num_prompts * req.n)  # before the cost of tokenizing
    await serving.compile_constraint(req)
    prompts = await serving.off_loop(_prompts, serving, req.prompt)
    echo_only = req.max_tokens == 0  # the engine samples one token, which the answer leaves out
    budgets = [
        serving.max_tokens(
            1 if echo_only else req.max_tokens, DEFAULT_MAX_TOKENS, len(p.token_ids),
            param="max_tokens", prompt_param="prompt",
        )
        for p in prompts
    ]
    request_id = new_id("cmpl")
    prompt_logprobs = req.logprobs if req.echo else None
    resumption = await serving.resumption(req, prompts, budgets, req.logprobs, echo=req.echo)
    seqs = serving.sequences(request_id, prompts, req, budgets, req.logprobs, prompt_logprobs, resumption, lora,
                             serving.priority(req, raw))
    answer_id, created = answered_as(request_id, resumption)
    renderer = CompletionRenderer(answer_id, serving.model_name(lora), serving.tokenizer, req, created)
    choices = Choices(seqs, prompts, req.n, echo_only, resumption=resumption, records=resumable(raw))
    return await serving.respond(raw, req, seqs, choices, renderer)


class CompletionRenderer:
    """The legacy completions wording: a choice's text, after its prompt when ``echo`` asks for it."""

    def __init__(
        self, request_id: str, model: str, tokenizer: Any, req: CompletionRequest, created: int | None = None
    ) -> None:
        self.request_id, self.model, self.tokenizer = request_id, model, tokenizer
        self.echo, self.top_k, self.return_token_ids = req.echo, req.logprobs, req.return_token_ids
        self.created = int(time.time()) if created is None else created

    def _prompt_text(self, prompt: Prompt) -> str:
        return prompt.text if prompt.text is not None else self.tokenizer.decode(prompt.token_ids)

    def _text(self, piece: Piece) -> str:
        if not (self.echo and piece.first):
            return piece.text
        return self._prompt_text(piece.prompt) + piece.text

    def _choice(self, piece: Piece) -> CompletionChoice:
        logprobs = None
        if self.top_k is not None and piece.logprobs is not None:
            # with echo, the choice's text starts with the prompt: the completion's offsets come after it
            shift = len(self._prompt_text(piece.prompt)) if self.echo else 0
            logprobs = completion_logprobs(
                self.tokenizer, piece.token_ids, piece.logprobs, self.top_k, piece.text_offset + shift
            )
            if self.echo and piece.first and piece.prompt_logprobs is not None:
                head = prompt_logprobs(self.tokenizer, piece.prompt.token_ids, piece.prompt_logprobs, self.top_k)
                logprobs = joined(head, logprobs)
        return CompletionChoice(
            index=piece.index,
            text=self._text(piece),
            logprobs=logprobs,
            finish_reason=piece.finish_reason,
            stop_reason=piece.stop_reason,
            prompt_token_ids=piece.prompt.token_ids if self.return_token_ids and piece.first else None,
            token_ids=piece.token_ids if self.return_token_ids else None,
        )

    def opening(self, index: int) -> Iterator[CompletionResponse]:
        return iter(())

    def chunks(self, piece: Piece) -> Iterator[CompletionResponse]:
        yield CompletionResponse(
            id=self.request_id, created=self.created, model=self.model, choices=[self._choice(piece)]
        )

    def usage_chunk(self, usage: Usage) -> CompletionResponse:
        return CompletionResponse(id=self.request_id, created=self.created, model=self.model, choices=[], usage=usage)

    def response(self, pieces: list[Piece], usage: Usage) -> CompletionResponse:
        return CompletionResponse(
            id=self.request_id, created=self.created, model=self.model, choices=[self._choice(p) for p in pieces],
            usage=usage,
        )  # fmt: skip
