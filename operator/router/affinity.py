"""The affinity key of a request: what decides which replica's prefix cache it should meet.

In order: the `x-session-id` header, the body's `user` field (requests of one conversation or user stay
together even when they share no text), then the first `prefixCharLength` characters of the prompt, or
of the chat messages rendered the way a chat template lays them out (role, then content, in order), so
that requests opening with the same system prompt land together. None when the request has none of
these (the balancer then picks the least loaded replica).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

SESSION_HEADER = "x-session-id"
PREFIX = "prefix\0"  # what a key drawn from the request's own text starts with


def from_text(key: str) -> bool:
    """Whether `key` is the request's text (its prefix), not a session or user the client named: only such a
    key is new to the caches when the router has not placed it lately (a new session is placed for the turns
    that follow it)."""
    return key.startswith(PREFIX)


def affinity_key(body: dict[str, Any], headers: Iterable[tuple[str, str]], prefix_chars: int) -> str | None:
    for name, value in headers:
        if name.lower() == SESSION_HEADER and value:
            return "session\0" + value
    user = body.get("user")
    if isinstance(user, str) and user:
        return "user\0" + user
    messages = body.get("messages")
    if isinstance(messages, list):
        prefix = _tools_text(body.get("tools")) + _chat_prefix(messages, prefix_chars)
        prefix = prefix[:prefix_chars]
    else:
        prefix = _prompt_prefix(body.get("prompt"), prefix_chars)
    return PREFIX + prefix if prefix else None


def _chat_prefix(messages: list[Any], limit: int) -> str:
    parts: list[str] = []
    size = 0
    for message in messages:
        if size >= limit:
            break
        if not isinstance(message, dict):
            continue
        text = f"<{message.get('role', '')}>\n{_content_text(message.get('content'))}\n"
        parts.append(text)
        size += len(text)
    return "".join(parts)[:limit]


def _tools_text(tools: Any) -> str:
    """Chat templates write a request's tools ahead of the conversation (in the system turn): requests that
    offer other tools share no cached prefix, and an agent's turns, which offer the same, do."""
    if not isinstance(tools, list) or not tools:
        return ""
    return "<tools>\n" + json.dumps(tools, sort_keys=True, separators=(",", ":")) + "\n"


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: the text ones make the prefix
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _prompt_prefix(prompt: Any, limit: int) -> str:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch: its first prompt
    if isinstance(prompt, str):
        return prompt[:limit]
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt[:limit]):
        # Token ids: about four characters a token, so the key covers a comparable prefix.
        return ",".join(map(str, prompt[: max(1, limit // 4)]))
    return ""
