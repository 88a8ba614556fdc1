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
