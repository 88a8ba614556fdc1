"""The calls of a constrained answer, streamed as the grammar writes them: with ``tool_choice: "required"``
the answer is a JSON array ``[{"name": ..., "parameters": {...}}, ...]`` (`folio.engine.tools.choice`),
said name first, then its arguments fragment by fragment; with a named function it is the arguments
object itself. The grammar keeps the JSON well formed; a scanner of JSON's lexical state (strings, escapes,
nesting) finds the names and the arguments' text as characters come, so each piece costs its own length."""

from __future__ import annotations

import json

from folio.engine.tools.calls import CallDelta
from folio.engine.tools.parser import Said


class NamedStream:
    """``tool_choice`` naming a function: the whole answer is that call's arguments."""

    def __init__(self, name: str) -> None:
        self.name, self.num_calls = name, 0

    def feed(self, text: str, final: bool = False) -> Said:
        if not text and not (final and not self.num_calls):
            return Said()
        first = self.num_calls == 0
        self.num_calls = 1
        return Said(calls=[CallDelta(0, self.name if first else None, text)])


class RequiredStream:
    """``tool_choice: "required"``: an array of calls, each an object with ``name`` and ``parameters``."""

    def __init__(self) -> None:
        self.num_calls = 0  # calls named so far
        self._depth = 0  # of the brackets open; a call object is at depth 2
        self._in_string = self._escape = False
        self._key: str | None = None  # the call object's member being read
        self._token = ""  # a key or the name being read (JSON text)
        self._reading: str | None = None  # "key", "name", "parameters" or None
        self._after_colon = False
        self._value_started = False
        self._name: str | None = None  # of the call being read
        self._pending = ""  # its arguments read before its name (never, from the grammar: kept for safety)

    def feed(self, text: str, final: bool = False) -> Said:
        said = Said()
        arguments: list[str] = []
        for ch in text:
            self._char(ch, said, arguments)
        self._flush(said, arguments)
        return said

    def _char(self, ch: str, said: Said, arguments: list[str]) -> None:
        depth_before = self._depth
        if self._in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
        elif ch == '"':
            self._in_string = True
        elif ch in "[{":
            self._depth += 1
        elif ch in "]}":
            self._depth -= 1
        reading = self._reading
        if reading == "parameters":
            ends = depth_before == 2 and not self._in_string and ch in ",}" and ch != '"'
            if ends:
                self._reading = None
            elif self._value_started or not ch.isspace():  # the value's text, without the space before it
                self._value_started = True
                arguments.append(ch)
        elif reading in ("key", "name"):
            self._token += ch
            if not self._in_string:  # the closing quote
                value = json.loads(self._token)
                self._reading, self._token = None, ""
                if reading == "key":
                    self._key = value
                else:
                    self._flush(said, arguments)
                    self._name = value
                    said.calls.append(CallDelta(self.num_calls, value))
                    self.num_calls += 1
                    if self._pending:
                        arguments.append(self._pending)
                        self._pending = ""
        elif depth_before == 2 and not self._in_string and ch == "}":  # a call object closes
            self._flush(said, arguments)
            self._name = self._key = None
        elif depth_before == 2 and self._in_string and ch == '"':  # a string opens at the object's level
            self._reading, self._token = ("name" if self._after_colon and self._key == "name" else "key"), ch
            self._after_colon = False
        elif depth_before == 2 and ch == ":":
            self._after_colon = True
            if self._key == "parameters":
                self._reading, self._after_colon, self._value_started = "parameters", False, False
        elif depth_before == 2 and ch == ",":
            self._key, self._after_colon = None, False

    def _flush(self, said: Said, arguments: list[str]) -> None:
        if not arguments:
            return
        text = "".join(arguments)
        arguments.clear()
        if self._name is None:
            self._pending += text
        else:
            said.calls.append(CallDelta(self.num_calls - 1, None, text))
