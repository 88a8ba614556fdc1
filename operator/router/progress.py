"""What a client has of an answer: the event framing of a relayed answer, and the records read out of it.

An engine that honours ``X-Folio-Resumable`` (`folio.engine.server.continuation`, the fixed contract) starts
each server-sent event that carries a choice's output with a *record*, a comment line
(``: folio-resume {json}``) naming the choice, the token ids since its previous record and, once it has
finished, how. `Progress.feed` takes the upstream's bytes as they come and hands back what the client
gets: whole events only (a partial one is held until the rest arrives, so an answer that breaks off never
leaves half an event before the error event or the continuation's first one), records taken out (they
are internal, and always stripped). It is cheap on purpose, since it runs on every chunk of every stream:
it never parses a ``data:`` line, it finds records with `bytes.find` (a record is an event's first line,
and a ``data:`` line, JSON on one line, cannot hold a newline, so ``: folio-resume`` at a line's start is
always one), a chunk without records passes on as the very same bytes object, and records are kept as
they came and read (`json.loads`) a batch at a time, or when a continuation needs them.

Per choice it keeps the token ids the client has (`array('i')`, four bytes a token), how the choice
finished and, for an answer that is not streamed, each token's logprobs and the prompt's: all that a
continuation needs (`Progress.resume`, the ``folio_resume`` object). An answer that is not streamed
arrives as records alone, then one ``data:`` event with the whole JSON: `Progress.final` holds that JSON,
and nothing is handed to the client before it.
"""

from __future__ import annotations

import json
import logging
from array import array
from typing import Any

from folio.engine.server.continuation import RECORD_PREFIX, Record

log = logging.getLogger(__name__)

DONE_EVENT = b"data: [DONE]\n\n"  # a stream's last event
_EVENT_END = b"\n\n"
_SKIP = len(RECORD_PREFIX)
_NEWLINE = 0x0A
_BATCH = 64  # records kept unread at most
_FAILED = b'"failed"'


class ChoiceProgress:
    """One choice as far as the client has it."""

    __slots__ = ("finish_reason", "logprobs", "prompt_logprobs", "stop_reason", "token_ids")

    def __init__(self) -> None:
        self.token_ids = array("i")
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.logprobs: list[Any] | None = None  # per token (unstreamed answers only)
        self.prompt_logprobs: list[Any] | None = None

    def resume(self, index: int, streamed: bool) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "index": index, "token_ids": self.token_ids.tolist(),
            "finish_reason": self.finish_reason, "stop_reason": self.stop_reason,
        }  # fmt: skip
        if not streamed:
            if self.logprobs is not None:
                entry["logprobs"] = self.logprobs
            if self.prompt_logprobs is not None:
                entry["prompt_logprobs"] = self.prompt_logprobs
        return entry


class Progress:
    """One answer's framing and records, across every attempt that writes it."""

    def __init__(self, streamed: bool) -> None:
        self.streamed = streamed
        self._choices: dict[int, ChoiceProgress] = {}  # read from the records (`choices`)
        self.response_id: str | None = None  # the answer's id and created (from the first resumable attempt)
        self.created: int | None = None
        self.failed: Record | None = None  # the engine's ``failed`` record: this attempt cannot finish
        self.ended = False  # streamed: ``[DONE]`` went by; unstreamed: the final ``data:`` event did
        self.final: bytes | None = None  # unstreamed: the whole JSON answer
        self._lost = False  # a record could not be read (`lost`)
        self._tail = b""
        self._pending: list[bytes] = []  # records taken out and not read yet (`_fold`)

    @property
    def choices(self) -> dict[int, ChoiceProgress]:
        """Each choice the client has anything of, by index."""
        self._fold()
        return self._choices

    @property
    def lost(self) -> bool:
        """A record could not be read: what the client has is not known exactly, so no continuing."""
        self._fold()
        return self._lost

    def restart(self) -> None:
        """A new attempt: what was held of the last one's unfinished event is not the client's."""
        self._tail = b""
        self.failed = None

    @property
    def held(self) -> int:
        """Bytes of an unfinished event held back."""
        return len(self._tail)

    def feed(self, chunk: bytes) -> bytes:
        """What of ``chunk`` (after what was held) the client gets now: its whole events, records taken out
        and read. Unstreamed answers give nothing (`final` takes their last event)."""
        data = self._tail + chunk if self._tail else chunk
        cut = data.rfind(_EVENT_END)
        if cut < 0:
            self._tail = data
            return b""
        cut += 2
        if cut == len(data):
            self._tail, block = b"", data
        else:
            self._tail, block = data[cut:], data[:cut]
        if block.find(RECORD_PREFIX) >= 0:
            block = self._strip(block)
        if not self.streamed:
            self._take_final(block)
            return b""
        if block.endswith(DONE_EVENT):
            self.ended = True
        return block

    def _strip(self, block: bytes) -> bytes:
        """``block`` (whole events) without its record lines, each kept to read; nothing from a ``failed``
        record on."""
        pending = self._pending
        if block.startswith(RECORD_PREFIX):  # the usual chunk: one event, its record first
            end = block.find(b"\n")
            after = end + 2 if block[end + 1 : end + 2] == b"\n" else end + 1  # a record-only event: all of it
            if block.find(RECORD_PREFIX, after) < 0 and block.find(_FAILED, 0, end) < 0:
                pending.append(block[_SKIP:end])
                if len(pending) >= _BATCH:
                    self._fold()
                return block[after:]
        kept: list[bytes] = []
        start = 0
        at = block.find(RECORD_PREFIX)
        while at >= 0:
            if at and block[at - 1] != _NEWLINE:  # inside a data line: text, not a record
                at = block.find(RECORD_PREFIX, at + 1)
                continue
            end = block.find(b"\n", at)  # there is one: the block ends with a blank line
            kept.append(block[start:at])
            payload = block[at + _SKIP : end]
            if payload.find(_FAILED) < 0:
                pending.append(payload)
            else:  # (or a stop string that says so: read at once either way)
                self._fold()
                self._read(payload)
            start = end + 1
            if block[start : start + 1] == b"\n":  # the record was the whole event: nothing is left of it
                start += 1
            if self.failed is not None:
                start = len(block)
                break
            at = block.find(RECORD_PREFIX, start)
        kept.append(block[start:])
        if len(pending) >= _BATCH:
            self._fold()
        return b"".join(kept)

    def _fold(self) -> None:
        """Read the records kept so far, in order. Parsing every record as it passes would cost every stream
        its price, and only a continuation needs them: read in batches, they cost a fraction (one
        `json.loads` for many) and still take a few bytes a token."""
        if not self._pending:
            return
        pending = self._pending[:]
        self._pending.clear()  # in place: `_strip` holds it
        try:
            raws = json.loads(b"[" + b",".join(pending) + b"]")
        except ValueError:
            for payload in pending:  # find the bad one; read the rest
                self._read(payload)
            return
        choices, apply = self._choices, self._apply
        for raw in raws:
            # the usual record, {"index", "token_ids"} of a choice seen before, at once; any other in full
            choice = choices.get(raw.get("index")) if type(raw) is dict and len(raw) == 2 else None
            ids = raw.get("token_ids") if choice is not None else None
            if type(ids) is list:
                try:
                    choice.token_ids.extend(ids)  # type: ignore[union-attr]
                except (TypeError, OverflowError) as exc:
                    self._unreadable(exc)
            else:
                apply(raw)

    def _read(self, payload: bytes) -> None:
        try:
            raw = json.loads(payload)
        except ValueError as exc:
            self._unreadable(exc)
            return
        self._apply(raw)

    def _unreadable(self, exc: Exception) -> None:
        if not self._lost:
            log.warning("an unreadable folio-resume record (%r): this answer cannot be continued", exc)
        self._lost = True

    def _apply(self, raw: Any) -> None:
        try:
            if "failed" in raw:
                self.failed = Record.failure(raw)
                return
            index = raw["index"]
            choice = self._choices.get(index)
            if choice is None:
                if not isinstance(index, int):
                    raise TypeError(f"index {index!r}")
                choice = self._choices[index] = ChoiceProgress()
            ids = raw["token_ids"]
            if ids:
                choice.token_ids.extend(ids)
            finish = raw.get("finish_reason")
            if finish is not None:
                choice.finish_reason, choice.stop_reason = finish, raw.get("stop_reason")
            if not self.streamed:
                logprobs = raw.get("logprobs")
                if logprobs is not None:
                    if choice.logprobs is None:
                        choice.logprobs = []
                    choice.logprobs.extend(logprobs)
                prompt_logprobs = raw.get("prompt_logprobs")
                if prompt_logprobs is not None:
                    choice.prompt_logprobs = prompt_logprobs
        except (ValueError, KeyError, TypeError, OverflowError) as exc:
            self._unreadable(exc)

    def _take_final(self, block: bytes) -> None:
        """An unstreamed answer's last event: ``data: {the whole JSON}``."""
        for event in block.split(_EVENT_END):
            if event.startswith(b"data:"):
                self.final = event[5:].strip()
                self.ended = True

    def resume(self) -> dict[str, Any]:
        """The ``folio_resume`` object that continues this answer elsewhere."""
        choices, streamed = self.choices, self.streamed
        return {
            "id": self.response_id,
            "created": self.created,
            "choices": [choices[i].resume(i, streamed) for i in sorted(choices)],
        }

    def tokens(self, index: int) -> list[int]:
        choice = self.choices.get(index)
        return choice.token_ids.tolist() if choice is not None else []
