"""``--speculative-config``: vLLM's JSON, read and checked before anything loads.

``{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": N, "prompt_lookup_min": M}``, or
``{"model": PATH, "num_speculative_tokens": K}`` for a draft model (``method`` "draft_model", implied by
``model``). A bad one is a `SpeculativeConfigError` naming the field, which `folio serve` reports at start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_SPECULATIVE_TOKENS = 16  # proposals verified in one step; past this the verify step costs more than it saves
METHODS = ("ngram", "draft_model")
_FIELDS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}


class SpeculativeConfigError(ValueError):
    """A ``--speculative-config`` Folio cannot run; the message says which field and why."""


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 0  # ngram: the longest suffix looked up in the context
    prompt_lookup_min: int = 0  # ngram: the shortest
    model: str | None = None  # draft_model: its folder

    @classmethod
    def parse(cls, value: str | dict[str, Any]) -> SpeculativeConfig:
        """The flag's JSON text (or the object `LLM(speculative_config=...)` takes)."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise SpeculativeConfigError(f"--speculative-config is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise SpeculativeConfigError(f"--speculative-config must be a JSON object, got {type(value).__name__}")
        unknown = sorted(set(value) - _FIELDS)
        if unknown:
            raise SpeculativeConfigError(f"--speculative-config: unknown field(s) {', '.join(unknown)} "
                                         f"(known: {', '.join(sorted(_FIELDS))})")  # fmt: skip
        method = value.get("method") or ("draft_model" if value.get("model") is not None else None)
        if method not in METHODS:
            raise SpeculativeConfigError(f"--speculative-config: method must be one of {', '.join(METHODS)} "
                                         f"(or a draft 'model'), got {method!r}")  # fmt: skip
        k = _int(value, "num_speculative_tokens", None, 1, MAX_SPECULATIVE_TOKENS)
        if method == "ngram":
            if value.get("model") is not None:
                raise SpeculativeConfigError("--speculative-config: method ngram takes no 'model'")
            high = _int(value, "prompt_lookup_max", 4, 1, 64)
            low = _int(value, "prompt_lookup_min", min(2, high), 1, 64)
            if low > high:
                raise SpeculativeConfigError(f"--speculative-config: prompt_lookup_min {low} exceeds "
                                             f"prompt_lookup_max {high}")  # fmt: skip
            return cls("ngram", k, prompt_lookup_max=high, prompt_lookup_min=low)
        model = value.get("model")
        if not isinstance(model, str) or not model:
            raise SpeculativeConfigError("--speculative-config: a draft model needs 'model', its folder")
        if "prompt_lookup_max" in value or "prompt_lookup_min" in value:
            raise SpeculativeConfigError("--speculative-config: prompt_lookup_* are for method ngram only")
        return cls("draft_model", k, model=model)


def _int(value: dict[str, Any], name: str, default: int | None, low: int, high: int) -> int:
    got = value.get(name, default)
    if got is None:
        raise SpeculativeConfigError(f"--speculative-config: {name} is required")
    if not isinstance(got, int) or isinstance(got, bool) or not low <= got <= high:
        raise SpeculativeConfigError(f"--speculative-config: {name} must be an integer from {low} to {high}, "
                                     f"got {got!r}")  # fmt: skip
    return got
