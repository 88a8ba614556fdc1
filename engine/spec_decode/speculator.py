"""Who speculates in a step, and how far: the scheduler asks `draft` for each decoding sequence.

Proposals cost a verify step one more row each; they pay when the target keeps them. Two back-offs keep
speculation from costing more than it gains:

- per sequence, by its own record: the number of tokens it proposes follows an average of how many of its
  last proposals the target kept (plus one, to find out whether more would be kept), and a sequence whose
  proposals the target keeps too rarely (`MIN_KEPT`) stops proposing for a while, twice as long each time;
- per step, by what a row costs on this machine (`StepCosts`, learnt from the decode steps the engine runs):
  a step of M decoding sequences gets the D more rows that give it the most tokens per second, M + E(D)
  tokens over the longer step's time, D = 0 (no proposals) included, and proposals only where they promise
  `MIN_GAIN` more than none. Rows go round the sequences a
  position at a time (every sequence's first proposal, then the second ones, ...), and E(D) counts each
  row at how often lately a proposal at its position was kept: later positions are kept less, so while a
  step reads the weights and little else (small batches; any GPU up to a large batch) rows are nearly free
  and every sequence proposes all it may, and as it turns compute-bound (a larger batch; a CPU soon) only
  the first positions, whose proposals are kept most, pay for their rows, then none. One such step in
  `EXPLORE_EVERY` takes one position more, so that the costs just past its choice are measured, not assumed.

Proposing itself costs time too (a draft model runs K steps of its own): the step budget counts the time
the last proposals took (an average) as part of the longer step.

The scheduler asks once per step (`plan`, for every decoding sequence together: a draft model proposes for
all of them in one batch), then takes each sequence's proposals as it schedules it (`draft`). Prompt lookup
proposes first (a lookup costs nothing), so the budget counts the rows there are at the positions they take
(a sequence without a match leaves its rows to the others' later positions, which are kept less); a draft
model proposes after, for the rows the budget takes. It also keeps
the counters of vLLM's ``vllm:spec_decode_*`` metrics (`SpecDecodeStats`).
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from folio.engine.sequence import Sequence
from folio.engine.spec_decode.config import SpeculativeConfig
from folio.engine.spec_decode.ngram import NgramProposer

EMA_WEIGHT = 0.5  # of the newest verify step in a sequence's average of kept tokens
MIN_KEPT = 0.25  # tokens kept per verify step, on average, below which a sequence pauses its proposals
MAX_PAUSE = 64  # steps
# One step in so many whose budget stops short takes one position more than the learnt costs say pays: costs
# past the sizes a step runs are extrapolated, and a step that never runs larger never learns better (one slow
# sample could keep proposals off for good)
EXPLORE_EVERY = 32
# How many more tokens a second a step's proposals must promise than none: the step costs are medians of noisy
# steps, and what a kept token costs besides its row (verifying it, its bookkeeping and streaming) is not in
# them, so a budget at break-even (a batch that is compute-bound already) would lose what it cannot see
MIN_GAIN = 0.05


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


class StepCosts:
    """Seconds a decode step of M single-token rows takes here: the median of its last `WINDOW` steps of each
    size, between sizes a straight line, past the largest size seen the line through the last two."""

    WINDOW = 9

    def __init__(self) -> None:
        self._samples: dict[int, deque[float]] = {}
        self._sizes: list[int] = []  # sorted
        self._medians: dict[int, float] = {}

    def record(self, rows: int, seconds: float) -> None:
        samples = self._samples.get(rows)
        if samples is None:
            samples = self._samples[rows] = deque(maxlen=self.WINDOW)
            bisect.insort(self._sizes, rows)
        samples.append(seconds)
        self._medians[rows] = statistics.median(samples)

    def cost(self, rows: int) -> float | None:
        """None where nothing tells: no size seen at or below ``rows``, or only one below it."""
        known = self._medians.get(rows)
        if known is not None:
            return known
        sizes = self._sizes
        at = bisect.bisect(sizes, rows)
        if at == 0:
            return None
        if at < len(sizes):
            a, b = sizes[at - 1], sizes[at]
        elif at >= 2:
            a, b = sizes[at - 2], sizes[at - 1]
        else:
            return None
        ta, tb = self._medians[a], self._medians[b]
        return max(0.0, ta + (tb - ta) * (rows - a) / (b - a))


class Proposer(Protocol):
    # Proposing costs a lookup, not a forward pass: a step asks for all that its sequences want and shares its
    # budget among the proposals there are (a sequence with no match leaves its rows to the others), rather
    # than sharing it among the wants before proposing
    cheap: bool

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        """Up to ``ks[i]`` tokens to verify after ``seqs[i]``'s last ([] where it has none)."""
        ...

    def forget(self, seq: Sequence) -> None: ...


class PromptLookup:
    """The ``ngram`` method's proposer over sequences (`NgramProposer` looks up one context)."""

    cheap = True

    def __init__(self, config: SpeculativeConfig) -> None:
        self.ngram = NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        return [self.ngram.propose(seq.token_ids, k) for seq, k in zip(seqs, ks, strict=True)]

    def forget(self, seq: Sequence) -> None:
        pass


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer | None = None) -> None:
        """``proposer``: the draft model's (`DraftModel`); prompt lookup's for the ``ngram`` method."""
        if proposer is None:
            if config.method != "ngram":
                raise ValueError(f"speculative method {config.method!r} needs its proposer")
            proposer = PromptLookup(config)
        self.k = config.num_speculative_tokens
        self.proposer = proposer
        self.stats = SpecDecodeStats(accepted_per_position=[0] * self.k)
        self.costs = StepCosts()
        # per position (0: the first proposal), how often lately a proposal there was kept, of those verified
        self.kept_at = [0.5] * self.k
        self.proposing_seconds = 0.0  # what proposing took lately, per step that proposed (an average)
        self._records: dict[int, _Record] = {}  # by id(sequence), while it runs
        self._planned: dict[int, list[int]] = {}  # this step's proposals, by id(sequence)
        self._short_steps = 0  # steps whose budget stopped short of all they could propose (`EXPLORE_EVERY`)

    def step_budget(self, num_decodes: int, lengths: list[int] | None = None) -> int:
        """Proposed tokens a step of ``num_decodes`` decoding sequences verifies, of the proposals of
        ``lengths`` (default: K for every sequence): as many as give it the most tokens per second (see the
        module's docstring), each row counted at its position as `share` hands them out; all it could, where
        the costs of such steps are not known yet (so that they get known)."""
        if lengths is None:
            lengths = [self.k] * num_decodes
        positions = [p for _, p in rows_in_turn(lengths)]
        most = len(positions)
        base = self.costs.cost(num_decodes) if num_decodes else None
        if base is None or not most:
            return most
        best, best_rate, expected = 0, num_decodes / base * (1 + MIN_GAIN), float(num_decodes)
        for extra in range(1, most + 1):
            cost = self.costs.cost(num_decodes + extra)
            if cost is None:
                return most
            expected += self.kept_at[positions[extra - 1]]
            rate = expected / (cost + self.proposing_seconds)
            if rate > best_rate:
                best, best_rate = extra, rate
        if best < most:
            self._short_steps += 1
            if self._short_steps % EXPLORE_EVERY == 0:  # measure the next position's rows (see EXPLORE_EVERY)
                return bisect.bisect_right(positions, positions[best])
        return best

    def step_ran(self, rows: int, seconds: float) -> None:
        """A decode step of ``rows`` single-token rows (verify positions included) took ``seconds``."""
        self.costs.record(rows, seconds)

    def plan(self, seqs: list[Sequence], limit: int) -> int:
        """This step's proposals for its decoding sequences ``seqs`` (in the order they are scheduled), at most
        ``limit`` tokens in all, as many as `step_budget` finds pay; `draft` hands them out. Returns their
        number."""
        self._planned.clear()
        wants = [(seq, k) for seq in seqs if (k := self._wanted(seq)) > 0]
        if not wants:
            return 0
        proposals: list[list[int]] | None = None
        if self.proposer.cheap:  # what there is to verify, before the budget is shared
            proposals = self._propose(wants)
            lengths = [len(p) for p in proposals]
        else:  # a draft model proposes only what the budget takes
            lengths = [k for _, k in wants]
        ks = share(lengths, min(limit, self.step_budget(len(seqs), lengths)))
        if proposals is None:
            wants = [(seq, k) for (seq, _), k in zip(wants, ks, strict=True) if k]
            proposals = self._propose(wants) if wants else []
            ks = [len(p) for p in proposals]
        for (seq, _), proposed, k in zip(wants, proposals, ks, strict=True):
            if k:
                self._planned[id(seq)] = proposed[:k]
        return sum(ks)

    def _propose(self, wants: list[tuple[Sequence, int]]) -> list[list[int]]:
        started = time.perf_counter()
        proposals = self.proposer.propose([seq for seq, _ in wants], [k for _, k in wants])
        self.proposing_seconds = 0.8 * self.proposing_seconds + 0.2 * (time.perf_counter() - started)
        return proposals

    def draft(self, seq: Sequence, room: int) -> list[int]:
        """The tokens `plan` proposed after ``seq``'s last one, at most ``room``."""
        return self._planned.pop(id(seq), [])[: max(room, 0)]

    def _wanted(self, seq: Sequence) -> int:
        """How many tokens ``seq`` proposes this step (0: none; its record's pause counts down)."""
        if not _may_speculate(seq):
            return 0
        record = self._records.get(id(seq))
        if record is None:
            record = self._records[id(seq)] = _Record(kept=float(self.k))
        if record.pause:
            record.pause -= 1
            return 0
        # never past the answer's end: its last token is the target's own
        return max(0, min(self.k, round(record.kept) + 1, seq.max_total_tokens - len(seq) - 1,
                          seq.params.max_tokens - seq.num_output_tokens - 1))  # fmt: skip

    def verified(self, seq: Sequence, proposed: int, kept: int) -> None:
        """The target kept ``kept`` of the ``proposed`` tokens of ``seq``'s verify step."""
        assert 0 <= kept <= proposed <= self.k
        stats = self.stats
        stats.num_drafts += 1
        stats.num_draft_tokens += proposed
        stats.num_accepted_tokens += kept
        for position in range(kept):
            stats.accepted_per_position[position] += 1
        for position in range(proposed):
            self.kept_at[position] = 0.9 * self.kept_at[position] + 0.1 * (position < kept)
        record = self._records[id(seq)]
        record.kept = (1 - EMA_WEIGHT) * record.kept + EMA_WEIGHT * kept
        if record.kept < MIN_KEPT:
            record.pause, record.next_pause = record.next_pause, min(MAX_PAUSE, record.next_pause * 2)
            record.kept = 1.0  # after the pause, a small proposal finds out whether things changed
        elif kept:
            record.next_pause = 1

    def forget(self, seq: Sequence) -> None:
        """``seq`` finished, or left the running batch (preempted)."""
        self._records.pop(id(seq), None)
        self._planned.pop(id(seq), None)
        self.proposer.forget(seq)


def rows_in_turn(lengths: list[int]) -> list[tuple[int, int]]:
    """Each proposal row of sequences proposing ``lengths`` tokens, as (sequence index, position), in the order
    a step's budget takes them: a position at a time (every sequence's first proposal, kept most often, then
    the second ones, ...)."""
    return [(i, p) for p in range(max(lengths, default=0)) for i, n in enumerate(lengths) if n > p]


def share(lengths: list[int], budget: int) -> list[int]:
    """How many of each of ``lengths`` proposals a step verifies: the first ``budget`` rows in turn."""
    ks = [0] * len(lengths)
    for i, _ in rows_in_turn(lengths)[: max(budget, 0)]:
        ks[i] += 1
    return ks


def _may_speculate(seq: Sequence) -> bool:
    """Proposals are verified on the target's own distribution at each position (under a grammar, each row
    masked by the grammar's state after the proposals before it: `mask.constrained_rows`); penalties make
    that distribution depend on the tokens before it in ways the verify step does not follow, so such
    sequences decode one token at a time, as do those that still need their prompt's logits."""
    params = seq.params
    return not params.has_penalties and seq.prompt_logits is None
