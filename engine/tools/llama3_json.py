"""Llama 3.1-3.3's JSON format: the whole answer is the call(s), ``{"name": ..., "parameters": {...}}``
(``arguments`` also read), after an optional ``<|python_tag|>``, several separated by ``;``. An answer that
does not start so is content."""

from __future__ import annotations

import json
from typing import Any

from folio.engine.tools.parser import ToolParser

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    skip_special_tokens = False  # <|python_tag|> is a special token

    def region_start(self, text: str, at_start: bool) -> tuple[int | None, int]:
        if not at_start:
            return None, 0
        body = text.lstrip()
        start = len(text) - len(body)
        if body.startswith(("{", PYTHON_TAG)):
            return start, 0
        if PYTHON_TAG.startswith(body):  # only whitespace yet, or the tag's beginning: wait for more
            return None, len(text)
        return None, 0

    def region_end(self, region: str) -> int | None:
        return None  # the calls run to the answer's end

    def parse(self, region: str) -> list[tuple[str, Any]] | None:
        text = region.strip().removeprefix(PYTHON_TAG).strip()
        decoder, calls, at = json.JSONDecoder(), [], 0
        while at < len(text):
            try:
                call, at = decoder.raw_decode(text, at)
            except ValueError:
                return None
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                return None
            calls.append((call["name"], call.get("parameters", call.get("arguments", {}))))
            rest = text[at:].lstrip()
            if rest.startswith(";"):
                rest = rest[1:].lstrip()
            elif rest:
                return None
            at = len(text) - len(rest)
        return calls or None
