"""The rules a request must follow, each stated and worded once.

`BOUNDS` is the one table of the sampling fields' ranges. The HTTP request models
(`folio.engine.server.protocol`) and the offline API's `SamplingParams` both check against it, so a
field has the same bounds and the same message whichever way it comes in; the prompt's rules (not
empty, token ids in the vocabulary, room in the context) are shared the same way by the server's
endpoints and `LLMEngine.add_request`. A broken rule raises `RuleError`: a plain ValueError to an
offline caller, which also carries the parameter and the `ErrorCode` the server answers it with.

Plain Python (no torch, no web framework): the router reads the body limit from here too.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Sized
from dataclasses import dataclass
from typing import Any, TypeVar

from folio.engine.server.openai_errors import ErrorCode

T = TypeVar("T")

INT64_MAX = 2**63 - 1  # the sampler's tensors are int64; JSON integers are unbounded
# torch.Generator.manual_seed takes [-2**63, 2**64); choice k of a request is seeded seed + k, wrapped.
SEED_MIN, SEED_END = -(2**63), 2**64
MAX_LOGPROBS = 20  # top logprobs per token: OpenAI's limit, and vLLM's default max_logprobs
MAX_STOP_STRINGS = 16
# One request body limit for the router and the engine (`--max-request-body-bytes` of both): were the
# router's lower, it would refuse what the engine serves; were it higher, it would buffer and forward
# bodies only to see them refused. 32 MiB holds the largest batch a request may carry: 64 text prompts
# (`completions.MAX_PROMPTS`) of a 128k-token context at about 4 bytes a token.
DEFAULT_MAX_REQUEST_BODY_BYTES = 32 * 1024 * 1024
# The router's header naming a request's priority (its tenant's): it takes the place of the request's own
# `priority` field, and an engine scheduling fcfs ignores it (every request is 0 there).
PRIORITY_HEADER = "X-Folio-Priority"

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60


class RuleError(ValueError):
    """A request that breaks a rule: ``param`` names the field to blame, ``code`` the error's code."""

    def __init__(self, message: str, *, param: str | None = None, code: ErrorCode = ErrorCode.INVALID_VALUE) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


@dataclass(frozen=True)
class Bound:
    """The range of a number (``integer``: of an integer, never a bool); NaN and infinities never hold."""

    low: float
    high: float
    integer: bool = False
    low_open: bool = False
    high_open: bool = False
    note: str = ""  # what the message adds, e.g. which value disables the field

    def holds(self, value: object) -> bool:
        if not (_int(value) if self.integer else _finite(value)):
            return False
        assert isinstance(value, (int, float))
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def describe(self, plural: bool = False) -> str:
        kind = ("integers" if plural else "an integer") if self.integer else ("numbers" if plural else "a number")
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"{kind} in {left}{_num(self.low)}, {_num(self.high)}{right}{self.note}"

    def check(self, name: str, value: T) -> T:
        if not self.holds(value):
            raise RuleError(f"{name} must be {self.describe()}, got {_repr.repr(value)}", param=name)
        return value

    def json_schema(self) -> dict[str, float]:
        """The range in JSON Schema words, for the OpenAPI document."""
        return {
            "exclusiveMinimum" if self.low_open else "minimum": self.low,
            "exclusiveMaximum" if self.high_open else "maximum": self.high,
        }


_COUNT = Bound(1, INT64_MAX, integer=True)
_LOGPROBS = Bound(0, MAX_LOGPROBS, integer=True)
_PENALTY = Bound(-2, 2)
TOKEN_ID = Bound(0, INT64_MAX, integer=True)

# The range of each sampling field, by its SamplingParams name (the OpenAI name where they differ is
# checked against the same entry: max_completion_tokens as max_tokens, top_logprobs as logprobs).
BOUNDS: dict[str, Bound] = {
    "n": _COUNT,
    "temperature": Bound(0, 2),  # OpenAI's range; 0 is greedy
    "top_p": Bound(0, 1, low_open=True),
    "top_k": Bound(-1, INT64_MAX, integer=True, note=" (-1 or 0 disables it)"),
    "min_p": Bound(0, 1),
    "repetition_penalty": Bound(0, 10, low_open=True),
    "presence_penalty": _PENALTY,
    "frequency_penalty": _PENALTY,
    "seed": Bound(SEED_MIN, SEED_END, integer=True, high_open=True),
    "max_tokens": _COUNT,
    "logprobs": _LOGPROBS,
    "prompt_logprobs": _LOGPROBS,
}
# /v1/completions' max_tokens may be 0 with echo (the prompt's logprobs only); the endpoint checks the echo.
MAX_TOKENS_WITH_ECHO = Bound(0, INT64_MAX, integer=True)


def check_stop(stop: str | list[str] | None) -> list[str]:
    """The stop strings as a list: at most MAX_STOP_STRINGS, none of them empty."""
    strings = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
    if len(strings) > MAX_STOP_STRINGS or any(not isinstance(s, str) or not s for s in strings):
        raise RuleError(
            f"stop must be at most {MAX_STOP_STRINGS} non-empty strings, got {_repr.repr(stop)}", param="stop"
        )
    return strings


def check_token_ids(name: str, ids: list[int] | None) -> list[int]:
    """A list of token ids the sampler can hold (e.g. stop_token_ids); None is an empty list."""
    ids = list(ids or [])
    if not all(TOKEN_ID.holds(t) for t in ids):
        raise RuleError(f"{name} must be a list of {TOKEN_ID.describe(plural=True)}, got {_repr.repr(ids)}", param=name)
    return ids


# --------------------------------------------------------------------------------------------- prompts


def check_not_empty(prompt: Sized, param: str = "prompt") -> None:
    if len(prompt) == 0:
        raise RuleError("the prompt must not be empty", param=param)


def check_prompt_ids(ids: list[Any], vocab_size: int | None, param: str = "prompt") -> None:
    """A prompt's token ids: at least one, each in the vocabulary (when its size is known)."""
    check_not_empty(ids, param)
    if vocab_size is None:
        return
    bad = next((t for t in ids if not _int(t) or not 0 <= t < vocab_size), None)
    if bad is not None:
        raise RuleError(f"prompt token ids must be integers in [0, {vocab_size}), got {bad!r}", param=param)


def check_context(
    prompt_len: int, completion_len: int, limit: int, *, param: str = "max_tokens", prompt_param: str = "prompt"
) -> None:
    """The prompt and ``completion_len`` tokens after it fit the context; else OpenAI's words, blaming the
    prompt when it alone leaves no room (``prompt_param``), else the completion's budget (``param``)."""
    if prompt_len + completion_len > limit:
        raise RuleError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + completion_len} tokens ({prompt_len} in the prompt, {completion_len} for the "
            f"completion). Please reduce the length of the prompt or completion.",
            param=prompt_param if prompt_len >= limit else param,
            code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        )


def _num(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
