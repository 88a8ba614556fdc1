"""Per-request sampling parameters (the vLLM shape), validated when constructed against the same rules
(`folio.engine.rules`) as the HTTP API's requests, with the same messages."""

from __future__ import annotations

from dataclasses import dataclass, field

from folio.engine.rules import BOUNDS, SEED_END, SEED_MIN, check_stop, check_token_ids

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

