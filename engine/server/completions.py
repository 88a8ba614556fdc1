"""POST /v1/completions."""

from __future__ import annotations

import time
from collections.abc import Iterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from folio.engine.outputs import RequestOutput
from folio.engine.server.errors import bad_request
from folio.engine.server.logprobs import completion_logprobs
from folio.engine.server.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
)
from folio.engine.server.serving import OpenAIServing, Prompt, new_id, usage
from folio.engine.server.sse import EventStream

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint
MAX_PROMPTS = 64


def _prompts(serving: OpenAIServing, prompt: str | list[str] | list[int] | list[list[int]]) -> list[Prompt]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise bad_request("The prompt must not be empty.", param="prompt")
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
    serving.check_common(req)
    if req.suffix:
        raise bad_request("suffix is not supported.", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of must equal n (no server-side ranking).", param="best_of")
    if req.echo and req.logprobs is not None:
        raise bad_request("echo together with logprobs is not supported.", param="echo")
    prompts = _prompts(serving, req.prompt)
    budgets = [
        serving.max_tokens(
            req.max_tokens, DEFAULT_MAX_TOKENS, len(p.token_ids), param="max_tokens", prompt_param="prompt"
        )
        for p in prompts
    ]
    request_id = new_id("cmpl")
    seqs = serving.sequences(request_id, prompts, req, budgets, req.logprobs)
    # Sequence id -> (choice index, its prompt).
    choice = {s.request_id: (i, prompts[i // req.n]) for i, s in enumerate(seqs)}
    prompt_tokens = sum(len(p.token_ids) for p in prompts)
    model = serving.config.served_model_name
    tok = serving.tokenizer

    def echo_text(prompt: Prompt) -> str:
        if not req.echo:
            return ""
        return prompt.text if prompt.text is not None else tok.decode(prompt.token_ids)

    def logprobs(o: RequestOutput, start_token: int, text_offset: int) -> CompletionLogprobs | None:
        c = o.outputs[0]
        if req.logprobs is None or c.logprobs is None:
            return None
        return completion_logprobs(
            tok, c.token_ids[start_token:], c.logprobs[start_token:], req.logprobs, text_offset
        )

    if req.stream:
        stream = await serving.engine_stream(seqs)
        created = int(time.time())
        sent_text = dict.fromkeys(choice, 0)
        sent_tokens = dict.fromkeys(choice, 0)
        completion_tokens = dict.fromkeys(choice, 0)
        started: set[str] = set()

        def render(o: RequestOutput) -> Iterator[CompletionResponse]:
            c = o.outputs[0]
            index, prompt = choice[o.request_id]
            delta = c.text[sent_text[o.request_id] :]
            completion_tokens[o.request_id] = len(c.token_ids)
            if not delta and not o.finished:
                return  # e.g. half of a multi-byte character: wait for the rest
            if o.request_id not in started:
                started.add(o.request_id)
                delta = echo_text(prompt) + delta
            lp = logprobs(o, sent_tokens[o.request_id], sent_text[o.request_id])
            sent_text[o.request_id] = len(c.text)
            sent_tokens[o.request_id] = len(c.token_ids)
            yield CompletionResponse(
                id=request_id,
                created=created,
                model=model,
                choices=[
                    CompletionChoice(
                        index=index,
                        text=delta,
                        logprobs=lp,
                        finish_reason=c.finish_reason,
                        stop_reason=c.stop_reason,
                    )
                ],
            )

        def tail() -> Iterator[CompletionResponse]:
            if req.stream_options and req.stream_options.include_usage:
                yield CompletionResponse(
                    id=request_id,
                    created=created,
                    model=model,
                    choices=[],
                    usage=usage(prompt_tokens, sum(completion_tokens.values())),
                )

        return EventStream(serving.sse(stream, render, tail))

    finals = await serving.run_to_end(raw, seqs)
    choices = []
    for seq_id, (index, prompt) in choice.items():
        o = finals[seq_id]
        c = o.outputs[0]
        choices.append(
            CompletionChoice(
                index=index,
                text=echo_text(prompt) + c.text,
                logprobs=logprobs(o, 0, 0),
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            )
        )
    completion_tokens_total = sum(len(finals[s].outputs[0].token_ids) for s in choice)
    body = CompletionResponse(
        id=request_id, model=model, choices=choices, usage=usage(prompt_tokens, completion_tokens_total)
    )
    return JSONResponse(body.model_dump(mode="json"))
