"""A request's choices on their way to the client, for /v1/completions and /v1/chat/completions alike.

The engine hands over what each sequence gained in a step (`folio.engine.outputs`: new text, tokens and
logprobs). `Choices` turns that into `Piece`s, one per chunk to send; a step that brought tokens but no text
(half of a multi-byte character, or text held back for a stop string) sends nothing, and its tokens go
with the next chunk. The endpoint's `Renderer` words each piece as its OpenAI chunk, and the whole answer
of a non-streaming request. The work per step is proportional to what is new in it, so a stream costs
time linear in its length.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel

from folio.engine.outputs import CompletionOutput, RequestOutput
from folio.engine.server.async_engine import EngineRequest
from folio.engine.server.protocol import Usage


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


class Renderer(Protocol):
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

    def __init__(self, seqs: list[EngineRequest], prompts: list[Prompt], n: int, echo_only: bool = False) -> None:
        self._choices = {s.request_id: _Choice(i, prompts[i // n]) for i, s in enumerate(seqs)}
        self.num_prompt_tokens = sum(len(p.token_ids) for p in prompts)
        self.echo_only = echo_only

    @property
    def usage(self) -> Usage:
        completion = sum(c.num_tokens for c in self._choices.values())
        return Usage(
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=completion,
            total_tokens=self.num_prompt_tokens + completion,
        )

    def stream(self, out: RequestOutput, renderer: Renderer) -> Iterator[BaseModel]:
        """The chunks one step output of a sequence makes."""
        choice = self._choices[out.request_id]
        c = self._generated(out)
        if out.prompt_logprobs is not None:
            choice.prompt_logprobs = out.prompt_logprobs
        if not choice.opened:
            choice.opened = True
            yield from renderer.opening(choice.index)
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
        yield from renderer.chunks(piece)

    def whole(self, finals: dict[str, RequestOutput]) -> list[Piece]:
        """One piece per choice holding its whole answer (``finals``: each sequence's merged output)."""
        pieces = []
        for rid, choice in self._choices.items():
            c = self._generated(finals[rid])
            choice.num_tokens = len(c.token_ids)
            pieces.append(
                Piece(
                    index=choice.index,
                    prompt=choice.prompt,
                    text=c.text,
                    token_ids=c.token_ids,
                    logprobs=c.logprobs,
                    text_offset=0,
                    first=True,
                    finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason,
                    prompt_logprobs=finals[rid].prompt_logprobs,
                )
            )
        return pieces

    def _generated(self, out: RequestOutput) -> CompletionOutput:
        c = out.outputs[0]
        if not self.echo_only:
            return c
        return dataclasses.replace(c, text="", token_ids=[], logprobs=[] if c.logprobs is not None else None)
