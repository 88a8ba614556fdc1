"""A function call as an answer carries it, and the ids that name calls."""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass

_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True)
class FunctionCall:
    name: str
    arguments: str  # JSON text, as OpenAI's API carries it


def call_id(answer_id: str, choice: int, call: int, *, length: int = 24, prefix: str = "call_") -> str:
    """The id of call ``call`` of choice ``choice`` of answer ``answer_id``: derived, not random, so that a
    replica that continues an answer another began (`folio.engine.server.continuation`) names its calls as
    the first would have. ``length`` alphanumerics after ``prefix`` (Mistral's templates want 9, no prefix)."""
    digest = int.from_bytes(hashlib.sha256(f"{answer_id}/{choice}/{call}".encode()).digest(), "big")
    chars = []
    for _ in range(length):
        digest, k = divmod(digest, len(_ALPHABET))
        chars.append(_ALPHABET[k])
    return prefix + "".join(chars)


@dataclass(frozen=True)
class CallDelta:
    """What a stream says of call ``index``: its first delta names it; ``arguments`` is the next fragment
    of its arguments' JSON text (all of it, for a call said whole)."""

    index: int
    name: str | None = None
    arguments: str = ""


def merge_calls(deltas: list[CallDelta]) -> list[FunctionCall]:
    """The calls a stream of deltas said, in index order."""
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for d in deltas:
        if d.name is not None:
            names[d.index] = d.name
        arguments[d.index] = arguments.get(d.index, "") + d.arguments
    assert set(arguments) <= set(names), "a call's fragments came before its name"
    return [FunctionCall(names[i], arguments.get(i, "")) for i in sorted(names)]
