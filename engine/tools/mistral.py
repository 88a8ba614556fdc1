"""Mistral's format: ``[TOOL_CALLS]`` then the calls to the answer's end, either a JSON list
``[{"name": ..., "arguments": {...}}, ...]`` (tokenizer versions up to 7) or, from version 11, each call
as ``NAME[ARGS]{...}`` (or ``NAME{...}``) after its own ``[TOOL_CALLS]``. Mistral's templates want call
ids of exactly nine letters and digits."""

from __future__ import annotations

import json
import re
from typing import Any

from folio.engine.tools.parser import ToolParser, held_prefix

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"
_NAME = re.compile(r"\s*([A-Za-z0-9_.-]{1,64})\s*")


class MistralParser(ToolParser):
    name = "mistral"
    skip_special_tokens = False  # [TOOL_CALLS] is a special token
    id_prefix, id_length = "", 9

    def region_start(self, text: str, at_start: bool) -> tuple[int | None, int]:
        at = text.find(MARKER)
        return (at, 0) if at >= 0 else (None, held_prefix(text, MARKER))

    def region_end(self, region: str) -> int | None:
        return None

    def parse(self, region: str) -> list[tuple[str, Any]] | None:
        parts = [p.strip() for p in region.split(MARKER)[1:]]
        if len(parts) == 1 and parts[0].startswith(("[", "{")):
            try:
                listed = json.loads(parts[0])
            except ValueError:
                return None
            listed = listed if isinstance(listed, list) else [listed]
            if not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in listed):
                return None
            return [(c["name"], c.get("arguments", c.get("parameters", {}))) for c in listed] or None
        calls = []
        decoder = json.JSONDecoder()
        for part in parts:
            name = _NAME.match(part)
            if name is None:
                return None
            rest = part[name.end() :].removeprefix(ARGS).lstrip()
            try:
                arguments, end = decoder.raw_decode(rest)
            except ValueError:
                return None
            if rest[end:].strip():
                return None
            calls.append((name.group(1), arguments))
        return calls or None
