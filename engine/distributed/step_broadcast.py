"""Each step's metadata, from rank 0 (which schedules) to the ranks that only run the model.

The other ranks run the very same `ModelRunner.step` on a mirror of rank 0's batch, so every rank
lays out the same tokens, slots and block tables and meets the same collectives in the same order. A
mirrored sequence carries only what a step reads: this step's tokens (and the next one, which prompt
positions are scored against), where they start, the block table, the length, the sampling
parameters, and the tokens a verify step (speculative decoding) computes after the last one. Both
sides keep the mirrors of exactly the previous step's sequences, so a sequence that stays in the batch
sends only the blocks added to its table since, and its parameters once. A sequence
collecting logits over its prompt also sends the next prompt position it collects: every rank turns the
same slices of prompt positions into logits, whose vocabulary-parallel gather all ranks join.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from folio.engine.prompt_logits import PromptPositions
from folio.engine.sampling_params import SamplingParams
from folio.engine.scheduler import ScheduledSeq


class SeqUpdate(NamedTuple):
    """One sequence of a step, as rank 0 sends it (a tuple on the wire: pickled small)."""

    request_id: str
    start: int  # the first token's position this step
    num_tokens: int  # tokens this step
    tokens: list[int]  # the sequence's tokens from `start` on (this step's, and the next one)
    length: int
    num_prompt_tokens: int
    table: list[int]  # block table entries from `table_from` on
    table_from: int
    params: SamplingParams | None  # None when the worker has them
    lora_slot: int  # -1: no adapter
    prompt_next: int | None  # the next prompt position it collects logits of; None: none
    draft: list[int]  # the proposed tokens it verifies (speculative decoding), [] without


class StepEncoder:
    """Rank 0's side: a step's batch as `SeqUpdate`s, sending only what the mirrors lack."""

    def __init__(self) -> None:
        self._sent: dict[str, tuple[list[int], int]] = {}  # request id -> (the table list, entries sent)

    def encode(self, batch: list[ScheduledSeq]) -> list[SeqUpdate]:
        sent: dict[str, tuple[list[int], int]] = {}
        updates: list[SeqUpdate] = []
        for item in batch:
            seq = item.seq
            start, table = seq.num_computed_tokens, seq.block_table
            known = self._sent.get(seq.request_id)
            if known is not None and known[0] is table and len(table) >= known[1]:
                table_from, params = known[1], None  # tables only grow; a freed one is a new list
            else:
                table_from, params = 0, seq.params
            collector = getattr(seq, "prompt_logits", None)
            updates.append(SeqUpdate(
                seq.request_id, start, item.num_tokens, seq.token_ids[start : start + item.num_tokens + 1],
                len(seq), seq.num_prompt_tokens, table[table_from:], table_from, params, seq.lora_slot,
                None if collector is None or collector.complete else collector.next_position, item.draft,
            ))  # fmt: skip
            sent[seq.request_id] = (table, len(table))
        self._sent = sent
        return updates


class MirroredSeq:
    """What `ModelRunner.step` reads of a `Sequence`, rebuilt from `SeqUpdate`s on the other ranks."""

    __slots__ = ("block_table", "generator", "length", "lora_slot", "num_computed_tokens", "num_prompt_tokens",
                 "params", "prompt_logits", "request_id", "token_ids")  # fmt: skip

    def __init__(self, request_id: str, params: SamplingParams) -> None:
        self.request_id, self.params = request_id, params
        self.token_ids: list[int] = []  # right from num_computed_tokens on; placeholders before
        self.block_table: list[int] = []
        self.num_computed_tokens = self.length = self.num_prompt_tokens = 0
        self.lora_slot = -1
        self.generator: Any = None
        self.prompt_logits: PromptPositions | None = None

    def __len__(self) -> int:
        return self.length


class StepMirror:
    """A worker's side: `SeqUpdate`s back into the batch rank 0 scheduled."""

    def __init__(self) -> None:
        self._seqs: dict[str, MirroredSeq] = {}

    def decode(self, updates: list[SeqUpdate]) -> list[ScheduledSeq]:
        seqs: dict[str, MirroredSeq] = {}
        batch: list[ScheduledSeq] = []
        for u in updates:
            seq = self._seqs.get(u.request_id)
            if u.params is not None:
                seq = MirroredSeq(u.request_id, u.params)
            assert seq is not None, f"rank 0 sent a delta for {u.request_id!r}, which this rank has not seen"
            if u.table_from == 0:
                seq.block_table = list(u.table)
            else:
                assert len(seq.block_table) == u.table_from, "block table mirror out of step with rank 0"
                seq.block_table.extend(u.table)
            ids = seq.token_ids
            del ids[u.start :]
            ids.extend([0] * (u.start - len(ids)))
            ids.extend(u.tokens)
            seq.num_computed_tokens, seq.length, seq.num_prompt_tokens = u.start, u.length, u.num_prompt_tokens
            seq.lora_slot = u.lora_slot
            seq.prompt_logits = None if u.prompt_next is None else PromptPositions(u.num_prompt_tokens, u.prompt_next)
            seqs[u.request_id] = seq
            batch.append(ScheduledSeq(seq, u.num_tokens, u.draft))  # type: ignore[arg-type]
        self._seqs = seqs
        return batch
