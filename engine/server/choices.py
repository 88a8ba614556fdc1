"""A request's choices on their way to the client, for /v1/completions and /v1/chat/completions alike.

The engine hands over what each sequence gained in a step (`folio.engine.outputs`: new text, tokens and
logprobs). `Choices` turns that into `Piece`s, one per chunk to send; a step that brought tokens but no text
(half of a multi-byte character, or text held back for a stop string) sends nothing, and its tokens go
with the next chunk. The endpoint's `Renderer` words each piece as its OpenAI chunk, and the whole answer
of a non-streaming request. The work per step is proportional to what is new in it, so a stream costs
time linear in its length.

In the resumable mode (`folio.engine.server.continuation`) each event that carries a choice's output comes
with its record, which `Choices` alone decides. A continuation's choices start where the client's are: a
carried unfinished one does not open again and counts what the client has; a finished one does not run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel

from folio.engine.outputs import CompletionOutput, RequestOutput
from folio.engine.server.async_engine import EngineRequest
from folio.engine.server.continuation import Record
from folio.engine.server.protocol import Usage

if TYPE_CHECKING:
    from folio.engine.server.resumption import Carried, Resumption

Event = tuple[Record | None, BaseModel]  # a chunk to send, with its record in the resumable mode


@dataclass
class Prompt:
    token_ids: list[int]
    text: str | None = None


@dataclass
class Piece:
    """What one choice says in one chunk (or, for a full response, all it says)."""

    index: int
    prompt: Prompt
    text: str
    token_ids: list[int]  # the tokens since the choice's previous piece
    logprobs: list[dict[int, float]] | None  # theirs, one entry per token (None: not requested)
    text_offset: int  # characters of the choice's text before this piece's
    first: bool  # the choice's first piece
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None  # the prompt's, in the first piece when asked


@dataclass
class _Choice:
    index: int
    prompt: Prompt
    opened: bool = False  # has had an output
    num_pieces: int = 0
    num_tokens: int = 0
    num_chars: int = 0
    token_ids: list[int] = field(default_factory=list)  # not sent yet
    logprobs: list[dict[int, float]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    carried: Carried | None = None  # what the client had of it before this answer (a continuation)

    @classmethod
    def resumed(cls, carried: Carried, prompt: Prompt) -> _Choice:
        """A choice the client has begun: opened, its first piece sent, its tokens and text counted."""
        return cls(
            carried.index, prompt, opened=True, num_pieces=1, num_tokens=len(carried.token_ids),
            num_chars=len(carried.text), carried=carried,
        )  # fmt: skip


def choice_indexes(num_choices: int, resumption: Resumption | None) -> list[int]:
    """The choices whose sequences run, in order: all but those a continuation has finished."""
    done = resumption.finished if resumption is not None else set()
    return [i for i in range(num_choices) if i not in done]


class Renderer(Protocol):
    request_id: str  # the answer's id, and its created time: the same in every chunk
    created: int

    def opening(self, index: int) -> Iterable[BaseModel]:
        """Chunks that open a choice's stream, sent at its first output (chat: the role)."""
        ...

    def chunks(self, piece: Piece) -> Iterable[BaseModel]: ...

    def usage_chunk(self, usage: Usage) -> BaseModel: ...

    def response(self, pieces: list[Piece], usage: Usage) -> BaseModel: ...


class Choices:
    """The engine sequences of one request and the choices they answer: sequence k of prompt p is choice
    ``p * n + k`` (as `OpenAIServing.sequences` numbers them). ``echo_only`` (a ``max_tokens: 0`` echo, run
    with one token to get the prompt's logprobs) drops what the sequences generate."""

    def __init__(
        self,
        seqs: list[EngineRequest],
        prompts: list[Prompt],
        n: int,
        echo_only: bool = False,
        *,
        resumption: Resumption | None = None,
        records: bool = False,
    ) -> None:
        carried = resumption.carried if resumption is not None else {}
        indexes = choice_indexes(len(prompts) * n, resumption)
        self._choices = {
            s.request_id: _Choice.resumed(carried[i], prompts[i // n]) if i in carried else _Choice(i, prompts[i // n])
            for i, s in zip(indexes, seqs, strict=True)
        }
        self._finished = {i: c for i, c in carried.items() if c.finished}  # not run: rendered as carried
        self._prompts, self._n = prompts, n
        self.num_prompt_tokens = sum(len(p.token_ids) for p in prompts)
        self.echo_only = echo_only
        self.records = records

    @property
    def usage(self) -> Usage:
        completion = sum(c.num_tokens for c in self._choices.values())
        completion += sum(len(c.token_ids) for c in self._finished.values())
        return Usage(
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=completion,
            total_tokens=self.num_prompt_tokens + completion,
        )

    def stream(self, out: RequestOutput, renderer: Renderer) -> Iterator[Event]:
        """The chunks one step output of a sequence makes."""
        choice = self._choices[out.request_id]
        c = self._generated(out)
        if out.prompt_logprobs is not None:
            choice.prompt_logprobs = out.prompt_logprobs
        if not choice.opened:
            choice.opened = True
            opened = Record(index=choice.index) if self.records else None
            yield from self._with_record(renderer.opening(choice.index), opened)
        choice.num_tokens += len(c.token_ids)
        choice.token_ids += c.token_ids
        if c.logprobs is not None:
            choice.logprobs += c.logprobs
        if not c.text and not out.finished:
            return  # nothing to show yet: these tokens go with the next chunk
        piece = Piece(
            index=choice.index,
            prompt=choice.prompt,
            text=c.text,
            token_ids=choice.token_ids,
            logprobs=choice.logprobs if c.logprobs is not None else None,
            text_offset=choice.num_chars,
            first=choice.num_pieces == 0,
            finish_reason=c.finish_reason,
            stop_reason=c.stop_reason,
            prompt_logprobs=choice.prompt_logprobs if choice.num_pieces == 0 else None,
        )
        choice.num_pieces += 1
        choice.num_chars += len(c.text)
        choice.token_ids, choice.logprobs = [], []
        record = None
        if self.records:  # built only when sent: this runs for every chunk of every stream
            record = Record(piece.index, tuple(piece.token_ids), piece.finish_reason, piece.stop_reason)
        yield from self._with_record(renderer.chunks(piece), record)

    @staticmethod
    def _with_record(chunks: Iterable[BaseModel], record: Record | None) -> Iterator[Event]:
        """The chunks, the first with the record (None: not the resumable mode): one record per output sent."""
        for chunk in chunks:
            yield record, chunk
            if record is not None:
                record = Record(record.index)  # a chunk after the first would carry no more tokens

    def record(self, out: RequestOutput) -> Record:
        """The record of one step output of a request that is not streamed: its tokens with their logprobs
        (and the prompt's, with the first output of an echo request), everything the whole answer needs."""
        c = self._generated(out)
        logprobs = None if c.logprobs is None else [[[t, lp] for t, lp in entry.items()] for entry in c.logprobs]
        prompt = None
        if out.prompt_logprobs is not None:
            prompt = [None if e is None else [[t, lp] for t, lp in e.items()] for e in out.prompt_logprobs]
        return Record(
            self._choices[out.request_id].index, tuple(c.token_ids), c.finish_reason, c.stop_reason, logprobs, prompt
        )

    def whole(self, finals: dict[str, RequestOutput]) -> list[Piece]:
        """One piece per choice holding its whole answer (``finals``: each sequence's merged output), in
        choice order; a continuation's choices with what the client had before."""
        pieces = [_carried_piece(c, prompt) for c, prompt in self._finished_with_prompts()]
        for rid, choice in self._choices.items():
            final = finals[rid]
            c = self._generated(final)
            before = choice.carried
            logprobs, prompt_logprobs = c.logprobs, final.prompt_logprobs
            if before is not None:  # the client's part, then what ran here
                c = dataclasses.replace(
                    c, text=before.text + c.text, token_ids=before.token_ids + c.token_ids,
                )  # fmt: skip
                if logprobs is not None:
                    logprobs = (before.logprobs or []) + logprobs
                prompt_logprobs = before.prompt_logprobs
            choice.num_tokens = len(c.token_ids)
            pieces.append(
                Piece(
                    index=choice.index,
                    prompt=choice.prompt,
                    text=c.text,
                    token_ids=c.token_ids,
                    logprobs=logprobs,
                    text_offset=0,
                    first=True,
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                    prompt_logprobs=prompt_logprobs,
                )
            )
        return sorted(pieces, key=lambda p: p.index)

    def _finished_with_prompts(self) -> Iterator[tuple[Carried, Prompt]]:
        n = self._n
        for i, carried in sorted(self._finished.items()):
            yield carried, self._prompts[i // n]

    def _generated(self, out: RequestOutput) -> CompletionOutput:
        c = out.outputs[0]
        if not self.echo_only:
            return c
        return dataclasses.replace(c, text="", token_ids=[], logprobs=[] if c.logprobs is not None else None)


def _carried_piece(carried: Carried, prompt: Prompt) -> Piece:
    """The whole of a choice that had finished before the seam, as the client had it."""
    return Piece(
        index=carried.index, prompt=prompt, text=carried.text, token_ids=carried.token_ids,
        logprobs=carried.logprobs, text_offset=0, first=True, finish_reason=carried.finish_reason,
        stop_reason=carried.stop_reason, prompt_logprobs=carried.prompt_logprobs,
    )  # fmt: skip
