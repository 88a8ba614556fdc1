"""Who speculates in a step, and how far: the scheduler asks `draft` for each decoding sequence.

Proposals cost a verify step K more positions per sequence; they pay when the target keeps them. Two
back-offs keep speculation from ever costing more than it gains:

- per sequence, by its own record: the number of tokens it proposes follows an average of how many of its
  last proposals the target kept (plus one, to find out whether more would be kept), and a sequence whose
  proposals the target keeps too rarely (`MIN_KEPT`) stops proposing for a while, twice as long each time;
- per step, by the batch: a step's proposals are at most `DRAFT_TOKEN_BUDGET` less the step's decoding
  sequences, so that a batch large enough to keep the hardware busy without them runs without them
  (each proposal then costs a position of compute and saves a step's overhead that is no longer the
  bottleneck).

It also keeps the counters of vLLM's ``vllm:spec_decode_*`` metrics (`SpecDecodeStats`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from folio.engine.sequence import Sequence
from folio.engine.spec_decode.config import SpeculativeConfig
from folio.engine.spec_decode.ngram import NgramProposer
from folio.engine.structured import mask

DRAFT_TOKEN_BUDGET = 48  # proposals + decoding sequences in one step, past which a step proposes nothing
EMA_WEIGHT = 0.5  # of the newest verify step in a sequence's average of kept tokens
MIN_KEPT = 0.25  # tokens kept per verify step, on average, below which a sequence pauses its proposals
MAX_PAUSE = 64  # steps


@dataclass
class SpecDecodeStats:
    """vLLM v1's counters: verify steps, tokens proposed, tokens kept, and kept by position (0: the first)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verify step emits on average: the kept proposals and the target's own one."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


@dataclass
class _Record:
    """One sequence's speculation so far."""

    kept: float  # average tokens kept per verify step
    pause: int = 0  # steps left without proposals
    next_pause: int = 1  # how long the next pause is


class Speculator:
    def __init__(self, config: SpeculativeConfig) -> None:
        if config.method != "ngram":
            raise ValueError(f"speculative method {config.method!r} is not available")
        self.k = config.num_speculative_tokens
        self.proposer = NgramProposer(self.k, config.prompt_lookup_min, config.prompt_lookup_max)
        self.stats = SpecDecodeStats(accepted_per_position=[0] * self.k)
        self._records: dict[int, _Record] = {}  # by id(sequence), while it runs

    def step_budget(self, num_decodes: int) -> int:
        """Proposed tokens a step of ``num_decodes`` decoding sequences may verify."""
        return max(0, DRAFT_TOKEN_BUDGET - num_decodes)

    def draft(self, seq: Sequence, room: int) -> list[int]:
        """Tokens to verify after ``seq``'s last one, at most ``room``; [] where it should not speculate."""
        if room <= 0 or not _may_speculate(seq):
            return []
        record = self._records.get(id(seq))
        if record is None:
            record = self._records[id(seq)] = _Record(kept=float(self.k))
        if record.pause:
            record.pause -= 1
            return []
        # never past the answer's end: its last token is the target's own
        k = min(room, self.k, round(record.kept) + 1, seq.max_total_tokens - len(seq) - 1,
                seq.params.max_tokens - seq.num_output_tokens - 1)  # fmt: skip
        return self.proposer.propose(seq.token_ids, k) if k > 0 else []

    def verified(self, seq: Sequence, proposed: int, kept: int) -> None:
        """The target kept ``kept`` of the ``proposed`` tokens of ``seq``'s verify step."""
        assert 0 <= kept <= proposed <= self.k
        stats = self.stats
        stats.num_drafts += 1
        stats.num_draft_tokens += proposed
        stats.num_accepted_tokens += kept
        for position in range(kept):
            stats.accepted_per_position[position] += 1
        record = self._records[id(seq)]
        record.kept = (1 - EMA_WEIGHT) * record.kept + EMA_WEIGHT * kept
        if record.kept < MIN_KEPT:
            record.pause, record.next_pause = record.next_pause, min(MAX_PAUSE, record.next_pause * 2)
            record.kept = 1.0  # after the pause, a small proposal finds out whether things changed
        elif kept:
            record.next_pause = 1

    def forget(self, seq: Sequence) -> None:
        """``seq`` finished (or left the running batch for good)."""
        self._records.pop(id(seq), None)


def _may_speculate(seq: Sequence) -> bool:
    """Proposals are verified on the target's own distribution at each position; penalties and constraints
    make that distribution depend on the tokens before it in ways the verify step does not follow, so such
    sequences decode one token at a time, as do those that still need their prompt's logits."""
    params = seq.params
    return not params.has_penalties and not mask.constrained(seq) and seq.prompt_logits is None
