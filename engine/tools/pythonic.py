"""The pythonic format (Llama 3.2 and 4, ToolACE): the whole answer is a Python list of calls with keyword
arguments, ``[get_weather(city="Paris"), get_time(zone="CET")]``, optionally inside ``<|python_start|>`` ...
``<|python_end|>``. Arguments are Python literals; they are read with `ast.literal_eval`, never run."""

from __future__ import annotations

import ast
from typing import Any

from folio.engine.tools.parser import ToolParser

START, END = "<|python_start|>", "<|python_end|>"


class PythonicParser(ToolParser):
    name = "pythonic"
    skip_special_tokens = False  # Llama 4's <|python_start|> is a special token

    def region_start(self, text: str, at_start: bool) -> tuple[int | None, int]:
        if not at_start:
            return None, 0
        body = text.lstrip()
        if body.startswith(("[", START)):
            return len(text) - len(body), 0
        if START.startswith(body):
            return None, len(text)
        return None, 0

    def region_end(self, region: str) -> int | None:
        return None

    def parse(self, region: str) -> list[tuple[str, Any]] | None:
        text = region.strip().removeprefix(START).removesuffix(END).strip()
        try:
            tree = ast.parse(text, mode="eval").body
        except (SyntaxError, ValueError):
            return None
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        calls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
                return None
            try:
                arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return None
            if len(arguments) != len(node.keywords):
                return None  # **kwargs
            calls.append((node.func.id, arguments))
        return calls
