"""Shadow comparison: a mirrored request's canary answer held against the primary's.

Only requests whose answer is meant to be reproducible are compared: temperature 0, or a seed. The
proxy hands the primary's relayed bytes to `Capture.add` as they pass (a bounded copy, nothing
waits), the shadow task hands over its own, and when both sides are done the comparison is settled
on the event loop's next turn, never on the primary's path:
``folio_router_shadow_comparisons_total{result="match|mismatch|error"}`` (error: the canary failed
or answered something that is not a completion) and
``folio_router_shadow_latency_difference_seconds`` (canary minus primary). The answer text compared
is that of every choice (completion text or chat message content), streamed or not; ids, timestamps
and usage differ between any two answers and are left out.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from time import perf_counter
from typing import Any, Literal

Result = Literal["match", "mismatch", "error"]
MAX_CAPTURE_BYTES = 1 << 20  # per side; a larger answer is not compared


def comparable(body: bytes) -> bool:
    """Whether a request's answer should be reproducible: JSON with temperature 0 or a seed."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return False
    if not isinstance(data, dict):
        return False
    return data.get("temperature") == 0 or data.get("seed") is not None


def answer_text(body: bytes) -> list[str] | None:
    """Each choice's text from a completion or chat answer, whole or as server-sent events; None when
    the body is neither."""
    text = body.decode("utf-8", errors="replace")
    if text.lstrip().startswith("data:"):
        parts: dict[int, list[str]] = {}
        for line in text.splitlines():
            line = line.strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            try:
                chunk = json.loads(line[5:])
            except ValueError:
                return None
            if "error" in chunk:
                return None
            for choice in chunk.get("choices") or []:
                parts.setdefault(choice.get("index", 0), []).append(_choice_text(choice, "delta"))
        return ["".join(parts[i]) for i in sorted(parts)] if parts else None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        return None
    choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
    return [_choice_text(c, "message") for c in choices]


def _choice_text(choice: dict[str, Any], key: str) -> str:
    if "text" in choice:
        return str(choice.get("text") or "")
    return str((choice.get(key) or {}).get("content") or "")


class Capture:
    """One side's answer: status and a bounded copy of its bytes."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.truncated = False
        self.seconds: float | None = None

    def add(self, chunk: bytes) -> None:
        if self.truncated:
            return
        self.size += len(chunk)
        if self.size > MAX_CAPTURE_BYTES:
            self.truncated, self.chunks = True, []
            return
        self.chunks.append(chunk)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class Comparison:
    """A mirrored request's two answers; ``record(result, canary minus primary seconds)`` once both are in."""

    def __init__(self, record: Callable[[Result, float | None], None]) -> None:
        self.primary, self.shadow = Capture(), Capture()
        self._record = record
        self._started = perf_counter()
        self._pending = 2

    def finish_primary(self, status: int | None) -> None:
        self._finish(self.primary, status)

    def finish_shadow(self, status: int | None) -> None:
        self._finish(self.shadow, status)

    def _finish(self, side: Capture, status: int | None) -> None:
        if side.seconds is not None:
            return
        side.status, side.seconds = status, perf_counter() - self._started
        self._pending -= 1
        if self._pending == 0:
            asyncio.get_running_loop().call_soon(self._settle)

    def _settle(self) -> None:
        p, s = self.primary, self.shadow
        if p.status != 200 or p.truncated or s.truncated:
            return  # nothing comparable (the primary failed, or an answer too large to hold)
        primary = answer_text(p.body)
        if primary is None:
            return
        diff = None if s.seconds is None or p.seconds is None else s.seconds - p.seconds
        if s.status != 200:
            self._record("error", diff)
            return
        shadow = answer_text(s.body)
        if shadow is None:
            self._record("error", diff)
            return
        self._record("match" if shadow == primary else "mismatch", diff)
