"""Continuous batching: which sequences run in the next step, and how many of their tokens.

Each step has a token budget (``max_num_batched_tokens``). Running sequences go first, so decoding never
waits behind a long prompt; a prompt larger than what is left of the budget is prefilled in chunks over
several steps. The waiting queue is fair between client requests: a request's k-th waiting sequence
takes the k-th turn from the queue's head on, so one request of 512 sequences does not go first in
whole while others wait behind it; sequences of one request, and turns, keep arrival order. Waiting
requests join between steps while the budget, ``max_num_seqs`` and free KV blocks
allow. When a running sequence needs a block and none is free, the most recently admitted sequence is
preempted: its blocks are freed and it returns to the head of the queue, to be recomputed later.

Under the ``priority`` policy (vLLM's ``--scheduling-policy priority``) each sequence has its request's
``priority``, lower first: the waiting queue is ordered by priority, then by turns as above; the running
list by priority, then admission, so a step schedules higher priorities first and the sequence preempted
for room is one of the lowest priority, the most recently admitted of them. A preempted sequence returns
to the head of its priority's part of the queue. A waiting sequence that outranks the lowest running one
and cannot start (``max_num_seqs`` reached, or too few free blocks for its first chunk) takes its place:
that one is preempted (vLLM's priority preemption), so a critical request does not wait for a batch job's
answer to end. Under ``fcfs`` every priority is 0: the same rules, and no such preemption.

A sequence under a LoRA adapter also needs its adapter in a device slot (`LoRASlots`): one whose adapter
finds none stays waiting, and the sequences behind it are admitted past it. A queued sequence claims its
adapter (so one removed before it runs is kept for it) and holds its slot reference from admission until
it finishes, through preemption too. An adapter whose files fail to load fails its sequence alone (`take_failed`).

With speculative decoding (`folio.engine.spec_decode`), a decoding sequence may carry a draft: tokens
proposed after its last one (`Speculator.plan`, for the step's decoding sequences together, before anything is
scheduled; `Speculator.draft` as each is), computed in the same step at their positions and verified
there. A draft never costs anyone else their place: with too few free blocks it is dropped before anything
is preempted. `postprocess` appends the proposals the target kept and its own next token, each through the
stop checks, counts the kept ones computed, and gives back the blocks of the refused ones (`trim`).

After the step has run, `postprocess` does all of its bookkeeping: the scheduled tokens count as computed
(their full blocks join the prefix cache), each sampled sequence takes its token, and those that are done
(stop token, end of sequence, stop string, length) finish and free their blocks. A step that failed goes
to `fail` instead, which finishes its sequences with the reason "error".
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from folio.engine.block_manager import BlockManager
from folio.engine.lora.adapter import LoRAError
from folio.engine.prompt_logits import needs_prompt_logits
from folio.engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from folio.engine.lora.slots import LoRASlots
    from folio.engine.sampler import SampleResult
    from folio.engine.spec_decode.speculator import Speculator

log = logging.getLogger(__name__)


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_tokens: int  # tokens computed in this step, from seq.num_computed_tokens on (the draft's included)
    draft: list[int] = field(default_factory=list)  # proposed tokens after the sequence's last, to verify

    @property
    def start(self) -> int:
        """The position of its first token in this step."""
        return self.seq.num_computed_tokens

    @property
    def samples(self) -> bool:
        """Whether this step reaches the sequence's last token, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_tokens == len(self.seq) + len(self.draft)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool = True,
        lora_slots: LoRASlots | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.lora_slots = lora_slots
        self.speculator = speculator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()  # by (priority, round)
        self.running: list[Sequence] = []  # by priority, then admission
        self._waiting_in_group: Counter[str] = Counter()
        self.num_preemptions_total = 0
        self.prefix_cache_queries_total = 0
        self.prefix_cache_hits_total = 0
        self.failed: list[Sequence] = []  # finished by `schedule` itself (an adapter that cannot load)

    def add(self, seq: Sequence) -> None:
        """Queue ``seq`` at its group's next turn: after every waiting sequence of an earlier or the same
        turn, before those of later turns (round-robin between the requests that wait)."""
        if seq.lora_request is not None:  # its adapter is kept for it, even if removed before it runs
            assert self.lora_slots is not None, "the engine refuses adapters without LoRA"
            self.lora_slots.claim(seq.lora_request.lora_int_id)
        head = self.waiting[0].round if self.waiting else 0
        seq.round = head + self._waiting_in_group[seq.group]
        self._waiting_in_group[seq.group] += 1
        i = len(self.waiting)
        while i > 0 and (self.waiting[i - 1].priority, self.waiting[i - 1].round) > (seq.priority, seq.round):
            i -= 1
        self.waiting.insert(i, seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.failed)

    def schedule(self, busy: Collection[int] = (), max_seqs: int | None = None) -> list[ScheduledSeq]:
        """The next step's batch. ``busy``: the ids of sequences in a step still in flight (pipeline stages
        keep several): they are neither scheduled nor preempted until that step's tokens are back;
        ``max_seqs``: at most that many sequences in this batch (a micro-batch's share)."""
        limit = self.max_num_seqs if max_seqs is None else max_seqs
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSeq] = []
        preempted = False
        self._make_room_for_priority(busy)

        drafts = self._draft_budget()
        i = 0
        while i < len(self.running) and budget > 0 and len(scheduled) < limit:
            seq = self.running[i]
            if id(seq) in busy:
                i += 1
                continue
            n = min(seq.num_uncomputed_tokens, budget)
            draft = self._draft(seq, min(drafts, budget - n)) if n == seq.num_uncomputed_tokens == 1 else []
            while not self.block_manager.allocate(seq, n + len(draft)):
                if draft:  # a proposal is never worth a preemption
                    draft = []
                    continue
                victim = self._victim(busy)
                assert victim is not None  # ``seq`` itself is not in flight
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                scheduled.append(ScheduledSeq(seq, n + len(draft), draft))
                budget -= n + len(draft)
                drafts -= len(draft)
                i += 1

        # Admitting new work right after a preemption would only cause more of it.
        i = 0  # waiting sequences before i wait for an adapter slot; the others keep their turns
        while (i < len(self.waiting) and budget > 0 and len(self.running) < self.max_num_seqs and not preempted
               and len(scheduled) < limit):  # fmt: skip
            seq = self.waiting[i]
            if not self._can_hold_adapter(seq):
                i += 1
                continue
            # a cached prefix computes no logits, and prompt logprobs need every position's
            cached = [] if needs_prompt_logits(seq) else self.block_manager.find_cached_prefix(seq)
            num_cached = len(cached) * self.block_manager.block_size
            n = len(seq) - num_cached
            if n > budget:
                if not self.enable_chunked_prefill:
                    break
                n = budget
            if not self.block_manager.allocate(seq, n, cached):
                break
            del self.waiting[i]
            self._leave_waiting(seq)
            seq.num_computed_tokens = num_cached
            seq.status = SequenceStatus.RUNNING
            self._run(seq)
            if not self._hold_adapter(seq):
                continue
            self.prefix_cache_queries_total += len(seq)
            self.prefix_cache_hits_total += num_cached
            scheduled.append(ScheduledSeq(seq, n))
            budget -= n
        return scheduled

    def _draft_budget(self) -> int:
        """Plans this step's proposals (`Speculator.plan`); returns how many tokens they may take in all."""
        if self.speculator is None:
            return 0
        decoding = [seq for seq in self.running if seq.num_uncomputed_tokens == 1]
        return self.speculator.plan(decoding, self.max_num_batched_tokens - len(decoding))

    def _draft(self, seq: Sequence, room: int) -> list[int]:
        return self.speculator.draft(seq, room) if self.speculator is not None and room > 0 else []

    def _victim(self, busy: Collection[int]) -> Sequence | None:
        """The running sequence to preempt for room, out of the running list: the last not in flight."""
        for j in range(len(self.running) - 1, -1, -1):
            if id(self.running[j]) not in busy:
                return self.running.pop(j)
        return None

    def _make_room_for_priority(self, busy: Collection[int] = ()) -> None:
        """Preempt the lowest running sequences while the queue's head outranks them and cannot start."""
        while self.waiting and self.running and self.running[-1].priority > self.waiting[0].priority:
            head = self.waiting[0]
            if not self._can_hold_adapter(head):
                return  # it waits for an adapter slot, which no preemption here frees
            first_chunk = min(len(head), self.max_num_batched_tokens)
            blocks = self.block_manager.blocks_needed(first_chunk)
            if len(self.running) < self.max_num_seqs and blocks <= self.block_manager.num_free_blocks:
                return
            if id(self.running[-1]) in busy:
                return  # its step is in flight: the head waits for it
            self._preempt(self.running.pop())

    def _run(self, seq: Sequence) -> None:
        """Into the running list after every sequence of its priority or a higher one (lower value): the
        last is always one of the lowest priority, and is never scheduled ahead of the sequence it makes
        room for."""
        j = len(self.running)
        while j > 0 and self.running[j - 1].priority > seq.priority:
            j -= 1
        self.running.insert(j, seq)

    def _can_hold_adapter(self, seq: Sequence) -> bool:
        """Whether ``seq`` holds its adapter's slot or can get one now (always, for the base model)."""
        if seq.lora_request is None or seq.lora_slot >= 0:
            return True
        assert self.lora_slots is not None, "the engine refuses adapters without LoRA"
        return self.lora_slots.can_acquire(seq.lora_request.lora_int_id)

    def _hold_adapter(self, seq: Sequence) -> bool:
        """Take ``seq``'s slot reference (loading its adapter if needed) unless it holds one; an adapter
        that fails to load fails this sequence only (returns False)."""
        if seq.lora_request is None or seq.lora_slot >= 0:
            return True
        assert self.lora_slots is not None
        try:
            seq.lora_slot = self.lora_slots.acquire(seq.lora_request.lora_int_id)
        except LoRAError as exc:
            log.warning("request %s: %s", seq.request_id, exc)
            seq.finish_reason, seq.stop_reason, seq.error = "error", None, str(exc)
            self.finish(seq)
            self.failed.append(seq)
            return False
        return True

    def take_failed(self) -> list[Sequence]:
        """The sequences `schedule` finished since the last call (their clients get a last output)."""
        failed, self.failed = self.failed, []
        return failed

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        if self.speculator is not None:  # (a draft model's cache holds nothing for it while it waits)
            self.speculator.forget(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        # back at the head of its priority's part of the queue: its turn is now, so turns stay in order
        at = next((j for j, w in enumerate(self.waiting) if w.priority >= seq.priority), len(self.waiting))
        if at < len(self.waiting) and self.waiting[at].priority == seq.priority:
            seq.round = min(seq.round, self.waiting[at].round)
        self.waiting.insert(at, seq)
        self._waiting_in_group[seq.group] += 1
        self.num_preemptions_total += 1

    def postprocess(
        self, batch: list[ScheduledSeq], sampled: list[ScheduledSeq], result: SampleResult | None, now: float
    ) -> list[Sequence]:
        """The bookkeeping of a step that ran ``batch``, in which ``sampled`` got the tokens of ``result``.
        Returns the sequences with news for their clients (those that got a token), in ``sampled`` order."""
        for item in batch:  # a draft's tokens count once kept, below
            item.seq.num_computed_tokens += item.num_tokens - len(item.draft)
            assert item.seq.num_computed_tokens <= len(item.seq)
            self.block_manager.register_full_blocks(item.seq)
        if result is None:
            return []
        assert len(result.token_ids) == len(sampled)
        for i, item in enumerate(sampled):
            seq = item.seq
            assert seq.num_computed_tokens == len(seq), "sampled before its last token was computed"
            kept = result.kept[i] if result.kept is not None else []
            if item.draft:
                assert self.speculator is not None and kept == item.draft[: len(kept)]
                self.speculator.verified(seq, len(item.draft), len(kept))
            for j, token in enumerate([*kept, result.token_ids[i]]):
                if j < len(kept):  # a kept proposal: its K/V were computed in the verify step
                    assert result.kept_logprobs is not None
                    logprob, top = result.kept_logprobs[i][j]
                    seq.append_token(token, logprob, top, now)
                    seq.num_computed_tokens += 1
                else:
                    seq.append_token(token, result.sampled_logprobs[i], result.logprobs[i], now)
                try:
                    done = check_stop(seq, token)
                    if seq.grammar is not None:
                        done = advance_grammar(seq, token, done)
                except Exception as exc:  # e.g. a detokenizer error: this sequence's own fault
                    self.fail([seq], exc)
                    break
                if done is not None:
                    seq.finish_reason, seq.stop_reason = done
                    self.finish(seq)
                    break
            if item.draft and not seq.is_finished:  # the refused proposals' blocks go back
                self.block_manager.register_full_blocks(seq)
                self.block_manager.trim(seq, len(seq))
        return [item.seq for item in sampled]

    def fail(self, seqs: list[Sequence], exc: Exception) -> list[Sequence]:
        """Finish ``seqs`` with the reason "error" (a step running them raised ``exc``); returns them."""
        log.error("a step failed; failing its %d request(s): %s", len(seqs), [s.request_id for s in seqs],
                  exc_info=exc)
        for seq in seqs:
            seq.finish_reason, seq.stop_reason = "error", None
            seq.error = f"{type(exc).__name__}: {exc}"
            self.finish(seq)
        return seqs

    def _leave_waiting(self, seq: Sequence) -> None:
        self._waiting_in_group[seq.group] -= 1
        if not self._waiting_in_group[seq.group]:
            del self._waiting_in_group[seq.group]

    def finish(self, seq: Sequence) -> None:
        """Remove a finished or aborted sequence and free its blocks."""
        if self.speculator is not None:
            self.speculator.forget(seq)
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
            self._leave_waiting(seq)
        self.block_manager.free(seq)
        if seq.lora_request is not None and seq.status is not SequenceStatus.FINISHED:
            assert self.lora_slots is not None
            if seq.lora_slot >= 0:
                self.lora_slots.release(seq.lora_request.lora_int_id)
                seq.lora_slot = -1
            else:  # queued, never admitted (or its adapter failed to load): its claim goes
                self.lora_slots.unclaim(seq.lora_request.lora_int_id)
        seq.status = SequenceStatus.FINISHED


def advance_grammar(seq: Sequence, token: int, done: tuple[str, str | int | None] | None
                    ) -> tuple[str, str | int | None] | None:  # fmt: skip
    """Moves ``seq``'s grammar past ``token`` (the mask allowed only tokens it accepts); a grammar that is
    complete ends the answer ("stop") even where the end-of-sequence token does not (``ignore_eos``)."""
    if done is not None and done[0] == "stop" and (token in seq.eos_token_ids or token == done[1]):
        return done  # a stop token: not part of the grammar's text
    if not seq.grammar.accept_token(token):
        raise RuntimeError(f"token {token} is outside the answer's grammar")  # the mask rules this out
    return ("stop", None) if done is None and seq.grammar.is_terminated() else done


def check_stop(seq: Sequence, token: int) -> tuple[str, str | int | None] | None:
    """Whether ``token``, just appended, ends ``seq``: (finish reason, stop reason), or None to go on.
    A stop or end-of-sequence token adds no text; any other token is detokenized first. (`folio.engine.resume`
    replays a continuation's tokens through it, so that they end, or not, as they did.)"""
    params = seq.params
    if token in params.stop_token_ids:  # type: ignore[operator]
        return "stop", token
    if not params.ignore_eos and token in seq.eos_token_ids:
        return "stop", None
    stop = seq.detokenize(token)
    if stop is not None:
        return "stop", stop
    if seq.num_output_tokens >= params.max_tokens or len(seq) >= seq.max_total_tokens:
        return "length", None
    return None
