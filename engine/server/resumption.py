"""A continuation's ``folio_resume`` field (`folio.engine.server.continuation`), checked and replayed: what
the client already has of each choice, and the engine state to go on from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from folio.engine import rules
from folio.engine.resume import Replay, replay
from folio.engine.sampling_params import SamplingParams
from folio.engine.server.choices import Prompt
from folio.engine.server.continuation import RESUME_FIELD
from folio.engine.server.errors import bad_request
from folio.engine.server.protocol import FolioResume, ResumeChoice

Logprobs = list[dict[int, float]]


@dataclass
class Carried:
    """One choice the client has something of: its tokens and their text, how it finished (if it did)."""

    index: int
    token_ids: list[int]
    text: str  # what the client has of its text (all of it, for a finished choice)
    finish_reason: str | None
    stop_reason: str | int | None
    logprobs: Logprobs | None  # one entry per token, carried by the client (unstreamed requests)
    prompt_logprobs: list[dict[int, float] | None] | None
    replay: Replay  # an unfinished choice continues from it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Resumption:
    """The answer to continue: its id and created, and its choices the client has anything of."""

    id: str
    created: int
    carried: dict[int, Carried]

    @property
    def finished(self) -> set[int]:
        return {i for i, c in self.carried.items() if c.finished}


@dataclass(frozen=True)
class Against:
    """What the carried choices are checked and replayed against: the model, and what the answer shows."""

    tokenizer: Any
    vocab_size: int | None
    eos_token_ids: frozenset[int]
    max_model_len: int
    need_logprobs: bool  # the whole answer shows them (unstreamed): the client must carry those it has
    need_prompt_logprobs: bool


def prepare(
    field: FolioResume, prompts: list[Prompt], n: int, params: Callable[[int], SamplingParams], against: Against
) -> Resumption:
    """Checks ``field`` against the request (a 400 naming `RESUME_FIELD` when it does not fit) and replays
    each listed choice's tokens. ``params(i)``: choice i's sampling parameters. Runs the detokenizer over
    every carried token: call it off the event loop."""
    total = len(prompts) * n
    carried: dict[int, Carried] = {}
    for entry in field.choices:
        if entry.index >= total:
            raise _bad(f"choice index {entry.index} is out of range: the request has {total} choice(s)")
        if entry.index in carried:
            raise _bad(f"choice index {entry.index} is listed twice")
        carried[entry.index] = _carried(entry, prompts[entry.index // n], params(entry.index), against)
    return Resumption(field.id, field.created, carried)


def _carried(entry: ResumeChoice, prompt: Prompt, params: SamplingParams, against: Against) -> Carried:
    where = f"choice {entry.index}"
    ids = entry.token_ids
    if ids:
        try:
            rules.check_prompt_ids(ids, against.vocab_size, RESUME_FIELD)
        except rules.RuleError as exc:
            raise _bad(f"{where}: {exc.message}") from exc
    logprobs = None
    if against.need_logprobs:
        if entry.logprobs is None or len(entry.logprobs) != len(ids):
            raise _bad(f"{where}: the request asks for logprobs; give one entry per token")
        logprobs = [dict(pairs) for pairs in entry.logprobs]
    prompt_logprobs = None
    if against.need_prompt_logprobs:
        if entry.prompt_logprobs is None or len(entry.prompt_logprobs) != len(prompt.token_ids):
            raise _bad(f"{where}: the request echoes the prompt's logprobs; give one entry per prompt token")
        prompt_logprobs = [None if pairs is None else dict(pairs) for pairs in entry.prompt_logprobs]
    try:
        state = replay(against.tokenizer, prompt.token_ids, params, ids, eos_token_ids=against.eos_token_ids,
                       max_model_len=against.max_model_len)  # fmt: skip
    except ValueError as exc:
        raise _bad(f"{where}: {exc}") from exc
    except Exception as exc:  # the tokenizer choked on the client's tokens: their fault, not a 500
        raise _bad(f"{where}: the tokens could not be decoded: {exc}") from exc
    if entry.finish_reason is None and state.finished:
        raise _bad(f"{where}: its tokens already end it ({state.finish and state.finish[0]}); no room is left")
    text = state.sent_text + (state.text.take(True) if entry.finish_reason is not None else "")
    return Carried(
        entry.index, list(ids), text, entry.finish_reason, entry.stop_reason, logprobs, prompt_logprobs, state
    )


def _bad(message: str) -> Exception:
    return bad_request(f"Invalid {RESUME_FIELD}: {message}", param=RESUME_FIELD)
