"""What every tool-call format shares: an answer is content with call regions in it (a ``<tool_call>``
block, a ``[TOOL_CALLS]`` list, a JSON object that is the whole answer, ...). `ToolStream` says content as
it comes, holding back only what could begin a region, and holds each region until it is complete; then
the region's calls are said, or, if they do not parse or name a function the request did not offer, the
region is said as content: a malformed call is content, never an error. A whole answer is one stream fed at
once (`ToolParser.extract`), so streamed and unstreamed answers say the same.

A format (`ToolParser`) says where a region starts, where it ends, and what calls it holds.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, ClassVar

from folio.engine.tools.calls import CallDelta


@dataclass
class Said:
    """What an answer (or a piece of it) says to the client: content, then calls."""

    content: str = ""
    calls: list[CallDelta] = field(default_factory=list)


class ToolParser(ABC):
    """One format of tool calls in free text (``--tool-call-parser NAME``)."""

    name: ClassVar[str]
    # False when the format's markers are special tokens, which the answer's text must then keep
    skip_special_tokens: ClassVar[bool] = True
    id_prefix: ClassVar[str] = "call_"
    id_length: ClassVar[int] = 24

    @abstractmethod
    def region_start(self, text: str, at_start: bool) -> tuple[int | None, int]:
        """Where a call region begins in ``text``, else None and how many characters at its end could
        begin one once more text comes (held back). ``at_start``: nothing but whitespace came before."""

    @abstractmethod
    def region_end(self, region: str) -> int | None:
        """The length of the complete region that ``region`` begins with, or None while it is incomplete
        (at the answer's end, whatever is left is the region)."""

    @abstractmethod
    def parse(self, region: str) -> list[tuple[str, Any]] | None:
        """(name, arguments) of each call in a complete region; None when it is malformed."""

    def stream(self, tools: Collection[str], *, parallel: bool = True) -> ToolStream:
        return ToolStream(self, tools, parallel=parallel)

    def extract(self, text: str, tools: Collection[str], *, parallel: bool = True) -> Said:
        """The calls and content of a whole answer."""
        return self.stream(tools, parallel=parallel).feed(text, final=True)


def held_prefix(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` begin ``marker`` (and so may be its start)."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-k:]):
            return k
    return 0


def arguments_json(arguments: Any) -> str | None:
    """A call's arguments as OpenAI carries them, JSON text of an object; None when they are not one (a
    string holding an object's JSON, as some models write, counts)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return json.dumps(arguments, ensure_ascii=False)


class ToolStream:
    """One choice's answer through a parser. `feed` takes the next text and says what can be said of it;
    ``final`` (the answer's end) says everything that is left. Whitespace is held until content follows it,
    so that the whitespace around calls is never said and content is exactly the answer when it has none."""

    def __init__(self, parser: ToolParser, tools: Collection[str], *, parallel: bool = True) -> None:
        self.parser, self.tools, self.parallel = parser, frozenset(tools), parallel
        self._buf = ""  # text not said yet: held back, or a region not complete yet
        self._space = ""  # whitespace held until content follows it
        self._in_region = False
        self._before = ""  # the whitespace held before the region being read
        self._at_start = True  # nothing but whitespace has come yet
        self.num_calls = 0  # said so far

    def feed(self, text: str, final: bool = False) -> Said:
        said = Said()
        self._buf += text
        while self._buf:
            if not self._in_region:
                start, hold = self.parser.region_start(self._buf, self._at_start)
                if start is None:
                    cut = len(self._buf) if final else len(self._buf) - hold
                    self._content(said, self._buf[:cut])
                    self._buf = self._buf[cut:]
                    break
                self._content(said, self._buf[:start])
                # the whitespace before a region is not said, unless the region turns out to be content
                self._buf, self._in_region, self._before, self._space = self._buf[start:], True, self._space, ""
            end = self.parser.region_end(self._buf)
            if end is None:
                if not final:
                    break
                end = len(self._buf)
            region, self._buf, self._in_region = self._buf[:end], self._buf[end:], False
            self._at_start = False
            calls = self._calls(region)
            if calls is None:
                self._content(said, self._before + region)
            else:
                said.calls += calls
        if final and self._space and not self.num_calls:
            said.content += self._space  # an answer without calls keeps its text exactly
            self._space = ""
        return said

    def _content(self, said: Said, text: str) -> None:
        if not text:
            return
        body = text.rstrip()
        if body:
            said.content += self._space + body
            self._space, self._at_start = "", False
        self._space += text[len(body) :]

    def _calls(self, region: str) -> list[CallDelta] | None:
        parsed = self.parser.parse(region)
        if parsed is None:
            return None
        calls = []
        for name, arguments in parsed:
            args = arguments_json(arguments)
            if name not in self.tools or args is None:
                return None
            calls.append((name, args))
        if not self.parallel:  # OpenAI's parallel_tool_calls: false promises one call at most
            calls = calls[: max(0, 1 - self.num_calls)]
        said = [CallDelta(self.num_calls + i, name, args) for i, (name, args) in enumerate(calls)]
        self.num_calls += len(said)
        return said
