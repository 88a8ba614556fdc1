"""Continuous batching: which sequences run in the next step, and how many of their tokens.

Each step has a token budget (``max_num_batched_tokens``). Running sequences go first, so decoding never
waits behind a long prompt; a prompt larger than what is left of the budget is prefilled in chunks over
several steps. Waiting requests join between steps while the budget, ``max_num_seqs`` and free KV blocks
allow. When a running sequence needs a block and none is free, the most recently admitted sequence is
preempted: its blocks are freed and it returns to the head of the queue, to be recomputed later.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from folio.engine.block_manager import BlockManager
from folio.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # tokens of the sequence computed in this step, from seq.num_computed_tokens on

    @property
    def samples(self) -> bool:
        """Whether this step reaches the sequence's last token, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_tokens == len(self.seq)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool = True,
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions_total = 0
        self.prefix_cache_queries_total = 0
        self.prefix_cache_hits_total = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[ScheduledSeq]:
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted = False

        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.allocate(seq, n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                scheduled.append(ScheduledSeq(seq, n))
                budget -= n
                i += 1

        # Admitting new work right after a preemption would only cause more of it.
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not preempted:
            seq = self.waiting[0]
            cached = self.block_manager.find_cached_prefix(seq)
            num_cached = len(cached) * self.block_manager.block_size
            n = len(seq) - num_cached
            if n > budget:
                if not self.enable_chunked_prefill:
                    break
                n = budget
            if not self.block_manager.allocate(seq, n, cached):
                break
            self.waiting.popleft()
            seq.num_computed_tokens = num_cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self.prefix_cache_queries_total += len(seq)
            self.prefix_cache_hits_total += num_cached
            scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return scheduled

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions_total += 1

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
