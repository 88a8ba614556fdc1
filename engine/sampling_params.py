"""Per-request sampling parameters (the vLLM shape), validated when constructed against the same rules
(`folio.engine.rules`) as the HTTP API's requests, with the same messages."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from folio.engine.rules import BOUNDS, SEED_END, SEED_MIN, TOKEN_ID, RuleError, check_stop, check_token_ids
from folio.engine.structured.params import StructuredOutputsParams

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's range for a logit_bias value: -100 bans a token, 100 all but forces it

# Temperatures in (0, MIN_TEMPERATURE) are raised to it (as vLLM does): dividing logits by a smaller
# value overflows float32 and turns the softmax into NaNs. 0 still means greedy.
MIN_TEMPERATURE = 1e-2
_OPTIONAL = frozenset({"seed", "logprobs", "prompt_logprobs"})  # None: unseeded, no logprobs


@dataclass
class SamplingParams:
    """How to pick the tokens of one request.

    ``temperature == 0`` means greedy. ``top_k == -1`` (or 0) disables top-k. ``n > 1`` is fanned out by
    :class:`folio.engine.llm.LLM` and the server; the engine core itself runs one sequence per request.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = field(default_factory=list)
    stop_token_ids: list[int] | None = field(default_factory=list)
    max_tokens: int = 16
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # top-k of each prompt token's distribution (`folio.engine.prompt_logits`)
    # Folio's own: hand back the mean over prompt positions of the full logit vector (the parity gate's input)
    mean_prompt_logits: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (`folio.engine.structured.mask`)
    structured_outputs: StructuredOutputsParams | None = None  # the answer fits a schema, regex, choice, grammar

    def __post_init__(self) -> None:
        """Raises `folio.engine.rules.RuleError` (a ValueError) naming the first field out of its bounds."""
        self.stop = check_stop(self.stop)
        self.stop_token_ids = check_token_ids("stop_token_ids", self.stop_token_ids)
        if self.top_k == 0:
            self.top_k = -1
        for name, bound in BOUNDS.items():
            value = getattr(self, name)
            if value is not None or name not in _OPTIONAL:
                bound.check(name, value)
        if 0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = MIN_TEMPERATURE
        if self.logit_bias:
            self.logit_bias = check_logit_bias(self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )


def check_logit_bias(bias: dict[int, float]) -> dict[int, float]:
    """Token ids a sampler can index, values within ±`LOGIT_BIAS_LIMIT` (whether an id is in the vocabulary
    is the engine's to check: it knows the vocabulary)."""
    checked = {}
    for token, value in bias.items():
        if not TOKEN_ID.holds(token):
            raise RuleError(f"logit_bias keys must be {TOKEN_ID.describe(plural=True)}, got {token!r}", param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or abs(value) > LOGIT_BIAS_LIMIT:
            raise RuleError(f"logit_bias values must be numbers from -{LOGIT_BIAS_LIMIT:g} to {LOGIT_BIAS_LIMIT:g}, "
                            f"got {value!r} for token {token}", param="logit_bias")  # fmt: skip
        checked[token] = float(value)
    return checked


def offset_seed(seed: int | None, k: int) -> int | None:
    """The seed of a request's k-th choice: ``seed + k``, wrapped to stay a valid generator seed."""
    if seed is None:
        return None
    s = seed + k
    return s if s < SEED_END else s - (SEED_END - SEED_MIN)

