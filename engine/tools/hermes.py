"""Hermes's format (Qwen 2.5 and 3, Hermes 2 and 3, many fine-tunes): each call a JSON object
``{"name": ..., "arguments": {...}}`` in a ``<tool_call>`` ... ``</tool_call>`` block, content around them."""

from __future__ import annotations

import json
from typing import Any

from folio.engine.tools.parser import ToolParser, held_prefix

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class HermesParser(ToolParser):
    name = "hermes"

    def region_start(self, text: str, at_start: bool) -> tuple[int | None, int]:
        at = text.find(OPEN)
        return (at, 0) if at >= 0 else (None, held_prefix(text, OPEN))

    def region_end(self, region: str) -> int | None:
        at = region.find(CLOSE, len(OPEN))
        return None if at < 0 else at + len(CLOSE)

    def parse(self, region: str) -> list[tuple[str, Any]] | None:
        body = region[len(OPEN) :]
        if not body.endswith(CLOSE):
            return None  # cut short: the answer ended inside the block
        try:
            call = json.loads(body[: -len(CLOSE)])
        except ValueError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        return [(call["name"], call.get("arguments", {}))]
