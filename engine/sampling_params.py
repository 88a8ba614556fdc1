"""Per-request sampling parameters (the vLLM shape), validated when constructed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Temperatures in (0, MIN_TEMPERATURE) are raised to it (as vLLM does): dividing logits by a smaller
# value overflows float32 and turns the softmax into NaNs. 0 still means greedy.
MIN_TEMPERATURE = 1e-2
# torch.Generator.manual_seed takes [-2**63, 2**64); the sampler's index tensors are int64.
SEED_MIN, SEED_END = -(2**63), 2**64
SEED_RANGE = range(SEED_MIN, SEED_END)
INT64_MAX = 2**63 - 1


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

    def __post_init__(self) -> None:
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        else:
            self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == 0:
            self.top_k = -1
        self._validate()
        if 0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = MIN_TEMPERATURE

    def _validate(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")

        if not _int(self.n) or self.n < 1:
            raise bad("n", "an integer >= 1")
        if not _finite(self.temperature) or self.temperature < 0:
            raise bad("temperature", "a finite number >= 0")
        if not _finite(self.top_p) or not 0 < self.top_p <= 1:
            raise bad("top_p", "in (0, 1]")
        if not _int(self.top_k) or not -1 <= self.top_k <= INT64_MAX:
            raise bad("top_k", f"-1 (disabled) or an integer in [1, {INT64_MAX}]")
        if not _finite(self.min_p) or not 0 <= self.min_p <= 1:
            raise bad("min_p", "in [0, 1]")
        if not _finite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise bad("repetition_penalty", "a finite number > 0")
        if not _finite(self.presence_penalty) or not -2 <= self.presence_penalty <= 2:
            raise bad("presence_penalty", "in [-2, 2]")
        if not _finite(self.frequency_penalty) or not -2 <= self.frequency_penalty <= 2:
            raise bad("frequency_penalty", "in [-2, 2]")
        if self.seed is not None and (not _int(self.seed) or self.seed not in SEED_RANGE):
            raise bad("seed", f"None or an integer in [{SEED_RANGE.start}, {SEED_RANGE.stop})")
        if not _int(self.max_tokens) or self.max_tokens < 1:
            raise bad("max_tokens", "an integer >= 1")
        if self.logprobs is not None and (not _int(self.logprobs) or not 0 <= self.logprobs <= INT64_MAX):
            raise bad("logprobs", "None or an integer >= 0")
        if self.prompt_logprobs is not None and (
            not _int(self.prompt_logprobs) or not 0 <= self.prompt_logprobs <= INT64_MAX
        ):
            raise bad("prompt_logprobs", "None or an integer >= 0")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "a list of non-empty strings")
        if any(not _int(t) or not 0 <= t <= INT64_MAX for t in self.stop_token_ids):
            raise bad("stop_token_ids", "a list of non-negative token ids")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
        )


def offset_seed(seed: int | None, k: int) -> int | None:
    """The seed of a request's k-th choice: ``seed + k``, wrapped to stay a valid generator seed."""
    if seed is None:
        return None
    s = seed + k
    return s if s < SEED_END else s - (SEED_END - SEED_MIN)


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
