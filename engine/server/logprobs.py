"""Turns the engine's per-token logprob dicts into OpenAI's two response shapes."""

from __future__ import annotations

from typing import Any

from folio.engine.server.protocol import ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob


def _token(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id])


def _top(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
    return sorted(entry.items(), key=lambda kv: kv[1], reverse=True)[:k]


def completion_logprobs(
    tokenizer: Any, token_ids: list[int], entries: list[dict[int, float]], k: int, text_offset: int
) -> CompletionLogprobs:
    """The legacy shape: parallel lists of tokens, their logprobs, top-k maps and text offsets."""
    out = CompletionLogprobs()
    offset = text_offset
    for token_id, entry in zip(token_ids, entries, strict=False):
        token = _token(tokenizer, token_id)
        out.tokens.append(token)
        out.token_logprobs.append(entry.get(token_id))
        out.top_logprobs.append({_token(tokenizer, t): lp for t, lp in _top(entry, k)} if k else None)
        out.text_offset.append(offset)
        offset += len(token)
    return out


def prompt_logprobs(
    tokenizer: Any, token_ids: list[int], entries: list[dict[int, float] | None], k: int
) -> CompletionLogprobs:
    """The echoed prompt's part of the legacy shape: its first token has ``null`` logprobs (nothing
    predicts it), as in OpenAI's and vLLM's answers."""
    out = CompletionLogprobs()
    offset = 0
    for token_id, entry in zip(token_ids, entries, strict=True):
        token = _token(tokenizer, token_id)
        out.tokens.append(token)
        out.token_logprobs.append(None if entry is None else entry.get(token_id))
        out.top_logprobs.append(
            {_token(tokenizer, t): lp for t, lp in _top(entry, k)} if k and entry is not None else None
        )
        out.text_offset.append(offset)
        offset += len(token)
    return out


def joined(head: CompletionLogprobs, tail: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(
        tokens=head.tokens + tail.tokens,
        token_logprobs=head.token_logprobs + tail.token_logprobs,
        top_logprobs=head.top_logprobs + tail.top_logprobs,
        text_offset=head.text_offset + tail.text_offset,
    )


def chat_logprobs(
    tokenizer: Any, token_ids: list[int], entries: list[dict[int, float]], k: int
) -> ChatLogprobs:
    content = []
    for token_id, entry in zip(token_ids, entries, strict=False):
        token = _token(tokenizer, token_id)
        top = [
            TopLogprob(token=(t := _token(tokenizer, tid)), logprob=lp, bytes=list(t.encode()))
            for tid, lp in _top(entry, k)
        ]
        # OpenAI reports -9999.0 for a token outside the returned distribution.
        logprob = entry.get(token_id, -9999.0)
        content.append(
            TokenLogprob(token=token, logprob=logprob, bytes=list(token.encode()), top_logprobs=top)
        )
    return ChatLogprobs(content=content)
