"""POST /v1/chat/completions: the tokenizer's chat template turns the messages into the prompt."""

from __future__ import annotations

import time
from collections.abc import Iterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from folio.engine.outputs import RequestOutput
from folio.engine.server.errors import bad_request
from folio.engine.server.logprobs import chat_logprobs
from folio.engine.server.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    Delta,
)
from folio.engine.server.serving import OpenAIServing, Prompt, new_id, usage
from folio.engine.server.sse import EventStream


def render_prompt(serving: OpenAIServing, req: ChatCompletionRequest) -> Prompt:
    tok = serving.tokenizer
    if not getattr(tok, "chat_template", None):
        raise bad_request("This model has no chat template; use /v1/completions.", param="messages")
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
        raise bad_request("tools are not supported.", param="tools")
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request("Only response_format type 'text' is supported.", param="response_format")
    if req.top_logprobs and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true.", param="top_logprobs")
    prompt = render_prompt(serving, req)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    budget = serving.max_tokens(requested, None, len(prompt.token_ids), param=param, prompt_param="messages")
    top_k = (req.top_logprobs or 0) if req.logprobs else None
    request_id = new_id("chatcmpl")
    seqs = serving.sequences(request_id, [prompt], req, [budget], top_k)
    index = {s.request_id: i for i, s in enumerate(seqs)}
    model = serving.config.served_model_name
    tok = serving.tokenizer

    def logprobs(o: RequestOutput, start: int) -> ChatLogprobs | None:
        c = o.outputs[0]
        if top_k is None or c.logprobs is None:
            return None
        return chat_logprobs(tok, c.token_ids[start:], c.logprobs[start:], top_k)

    if req.stream:
        stream = await serving.engine_stream(seqs)
        created = int(time.time())
        sent_text = dict.fromkeys(index, 0)
        sent_tokens = dict.fromkeys(index, 0)
        started: set[str] = set()

        def chunk(choices: list[ChatChunkChoice]) -> ChatCompletionChunk:
            return ChatCompletionChunk(id=request_id, created=created, model=model, choices=choices)

        def render(o: RequestOutput) -> Iterator[ChatCompletionChunk]:
            c = o.outputs[0]
            i = index[o.request_id]
            if o.request_id not in started:  # the first chunk of a choice carries the role
                started.add(o.request_id)
                yield chunk([ChatChunkChoice(index=i, delta=Delta(role="assistant", content=""))])
            delta = c.text[sent_text[o.request_id] :]
            if not delta and not o.finished:
                return  # e.g. half of a multi-byte character: wait for the rest
            lp = logprobs(o, sent_tokens[o.request_id])
            sent_text[o.request_id], sent_tokens[o.request_id] = len(c.text), len(c.token_ids)
            yield chunk(
                [
                    ChatChunkChoice(
                        index=i,
                        delta=Delta(content=delta or None),
                        logprobs=lp,
                        finish_reason=c.finish_reason,
                    )
                ]
            )

        def tail() -> Iterator[ChatCompletionChunk]:
            if req.stream_options and req.stream_options.include_usage:
                last = chunk([])
                last.usage = usage(len(prompt.token_ids), sum(sent_tokens.values()))
                yield last

        return EventStream(serving.sse(stream, render, tail))

    finals = await serving.run_to_end(raw, seqs)
    choices = []
    for seq_id, i in index.items():
        o = finals[seq_id]
        c = o.outputs[0]
        choices.append(
            ChatChoice(
                index=i,
                message=AssistantMessage(content=c.text),
                logprobs=logprobs(o, 0),
                finish_reason=c.finish_reason,
                stop_reason=c.stop_reason,
            )
        )
    completion_tokens = sum(len(finals[s].outputs[0].token_ids) for s in index)
    body = ChatCompletionResponse(
        id=request_id, model=model, choices=choices, usage=usage(len(prompt.token_ids), completion_tokens)
    )
    return JSONResponse(body.model_dump(mode="json"))
