"""The scheduler on its own, step by step: the token budget, chunked prefill, preemption and what follows
it, prefix-cache accounting, and the post-step bookkeeping (tokens, stop conditions, failures, freeing)."""

from __future__ import annotations

import pytest

from folio.engine.block_manager import BlockManager
from folio.engine.sampler import SampleResult
from folio.engine.sampling_params import SamplingParams
from folio.engine.scheduler import ScheduledSeq, Scheduler
from folio.engine.sequence import Sequence, SequenceStatus
from folio.engine.tokenizer.detokenizer import IncrementalDetokenizer

EOS = 0
LONG = SamplingParams(max_tokens=1000, ignore_eos=True)


class ByteTokenizer:
    """Token t is the byte t; a partial UTF-8 character decodes to U+FFFD, as byte-level BPE does."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode(errors="replace")


def new_seq(rid: str, prompt: list[int] | int, params: SamplingParams = LONG, max_total: int = 10_000) -> Sequence:
    """A request with ``prompt`` tokens (or that many of its id's letters, so prompts share no prefix)."""
    tokens = [ord(rid[i % len(rid)]) for i in range(prompt)] if isinstance(prompt, int) else prompt
    seq = Sequence(rid, None, tokens, params, max_total, frozenset({EOS}))
    seq.detokenizer = IncrementalDetokenizer(ByteTokenizer(), tokens)
    return seq


def scheduler(num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 8, budget: int = 100,
              chunked: bool = True, prefix_caching: bool = True) -> Scheduler:  # fmt: skip
    return Scheduler(BlockManager(num_blocks, block_size, prefix_caching), max_num_seqs, budget, chunked)


def run_step(s: Scheduler, tokens: dict[str, int] | None = None) -> tuple[list[ScheduledSeq], list[Sequence]]:
    """One step as the engine runs it, sampling ``tokens[request_id]`` (default 97, "a") where a sequence
    reaches its last token. Returns what was scheduled and what postprocess reported."""
    batch = s.schedule()
    sampled = [item for item in batch if item.samples]
    ids = [(tokens or {}).get(item.seq.request_id, 97) for item in sampled]
    result = SampleResult(ids, [None] * len(ids), [0.0] * len(ids)) if sampled else None
    return batch, s.postprocess(batch, sampled, result, now=1.0)


def shape(batch: list[ScheduledSeq]) -> list[tuple[str, int]]:
    return [(item.seq.request_id, item.num_tokens) for item in batch]


# --- the budget and chunked prefill ---------------------------------------------------------------------


def test_running_sequences_go_first_and_a_long_prompt_is_chunked_into_what_is_left() -> None:
    s = scheduler(budget=10)
    a, b = new_seq("a", 3), new_seq("b", 3)
    s.add(a)
    s.add(b)
    assert shape(run_step(s)[0]) == [("a", 3), ("b", 3)]
    s.add(long := new_seq("long", 25))
    assert shape(run_step(s)[0]) == [("a", 1), ("b", 1), ("long", 8)]  # decodes first, then 8 of the prompt
    assert shape(run_step(s)[0]) == [("a", 1), ("b", 1), ("long", 8)]
    batch, updated = run_step(s)
    assert shape(batch) == [("a", 1), ("b", 1), ("long", 8)]
    assert long not in updated and long.num_output_tokens == 0  # mid-prompt: nothing sampled yet
    batch, updated = run_step(s)
    assert shape(batch) == [("a", 1), ("b", 1), ("long", 1)]  # the prompt's last token, then its first sample
    assert long in updated and long.num_output_tokens == 1 and long.num_computed_tokens == 25


def test_without_chunked_prefill_a_prompt_waits_until_it_fits_whole() -> None:
    s = scheduler(budget=10, chunked=False)
    s.add(a := new_seq("a", 3, SamplingParams(max_tokens=2, ignore_eos=True)))
    run_step(s)
    s.add(new_seq("big", 10))
    assert shape(run_step(s)[0]) == [("a", 1)]  # 1 + 10 tokens exceed the budget: "big" waits
    assert a.is_finished and a.finish_reason == "length"
    assert shape(run_step(s)[0]) == [("big", 10)]


def test_max_num_seqs_caps_what_runs() -> None:
    s = scheduler(max_num_seqs=2)
    for rid in "abc":
        s.add(new_seq(rid, 3))
    assert shape(run_step(s)[0]) == [("a", 3), ("b", 3)]
    assert [q.request_id for q in s.waiting] == ["c"]


# --- preemption -----------------------------------------------------------------------------------------


def test_preemption_takes_the_latest_admitted_and_puts_it_first_in_the_queue() -> None:
    s = scheduler(num_blocks=4)
    a, b = new_seq("a", 7), new_seq("b", 7)
    s.add(a)
    s.add(b)
    run_step(s)  # both prompts: 2 blocks each, the cache is full
    run_step(s)  # the 8th tokens still fit their second blocks
    s.add(c := new_seq("c", 2))
    batch, _ = run_step(s)  # a's 9th token needs a third block: b, admitted last, makes room
    assert shape(batch) == [("a", 1)]
    assert s.num_preemptions_total == 1
    assert b.status is SequenceStatus.WAITING and b.block_table == [] and b.num_computed_tokens == 0
    assert list(s.waiting) == [b, c]  # ahead of the request that arrived before it was preempted
    assert b.output_token_ids == [97, 97]  # its tokens stay: they are recomputed, not sampled again


def test_nothing_is_admitted_in_the_step_of_a_preemption() -> None:
    s = scheduler(num_blocks=3, budget=3, prefix_caching=False)
    s.add(a := new_seq("a", 1))
    s.add(b := new_seq("b", 1))
    for _ in range(4):  # both decode until each fills its first block
        run_step(s)
    batch, _ = run_step(s)  # a takes the last free block; b, needing one too, is preempted
    assert shape(batch) == [("a", 1)] and b.status is SequenceStatus.WAITING
    # a 2-token chunk of b would fit the block it freed, but it would only be preempted again
    assert s.block_manager.num_free_blocks == 1 and list(s.waiting) == [b]
    batch, _ = run_step(s)  # the next step admits it again, in chunks of what the budget leaves
    assert shape(batch) == [("a", 1), ("b", 2)]
    assert [len(a), len(b)] == [7, 5]


def test_admission_after_a_preemption_keeps_queue_order() -> None:
    s = scheduler(num_blocks=5)
    s.add(a := new_seq("a", 7))
    s.add(b := new_seq("b", 7))
    run_step(s)  # 4 of 5 blocks in use
    run_step(s)
    s.add(new_seq("small", 1))
    s.add(new_seq("x", 4))
    batch, _ = run_step(s)  # a takes the fifth block; b needs one more: b itself is preempted
    assert shape(batch) == [("a", 1)] and b.status is SequenceStatus.WAITING
    assert [q.request_id for q in s.waiting] == ["b", "small", "x"]
    batch, _ = run_step(s)  # b, first in the queue, does not fit yet, and "small" (which would) waits behind it
    assert shape(batch) == [("a", 1)]
    s.finish(a)
    batch, _ = run_step(s)
    assert shape(batch) == [("b", 1), ("small", 1), ("x", 4)]  # b: 8 of its 9 tokens are still cached


def test_a_preempted_sequence_comes_back_from_its_cached_prefix() -> None:
    s = scheduler(num_blocks=4)
    s.add(a := new_seq("a", 7, SamplingParams(max_tokens=3, ignore_eos=True)))
    s.add(b := new_seq("b", 7))
    run_step(s)
    run_step(s)
    run_step(s)  # b preempted: a overwrites b's last block, and a's third token ends it
    assert b.status is SequenceStatus.WAITING and a.is_finished and s.block_manager.num_free_blocks == 4
    hits_before = s.prefix_cache_hits_total
    batch, _ = run_step(s)
    assert shape(batch) == [("b", 5)]  # b's first block is still cached: 4 of its 9 tokens
    assert s.prefix_cache_hits_total - hits_before == 4 and b.num_computed_tokens == 9


# --- prefix-cache accounting ------------------------------------------------------------------------------


@pytest.mark.parametrize(("prompt_len", "cached"), [(9, 8), (8, 4), (3, 0)])
def test_prefix_cache_counts_queried_and_found_prompt_tokens(prompt_len: int, cached: int) -> None:
    s = scheduler()
    s.add(first := new_seq("first", list(range(1, 10))))
    run_step(s)  # computes and registers its two full blocks
    queries, hits = s.prefix_cache_queries_total, s.prefix_cache_hits_total
    assert (queries, hits) == (9, 0)
    s.add(second := new_seq("second", list(range(1, prompt_len + 1))))  # shares first's prefix
    batch, _ = run_step(s)
    assert ("second", prompt_len - cached) in shape(batch)  # the last token is always computed
    assert s.prefix_cache_queries_total - queries == prompt_len
    assert s.prefix_cache_hits_total - hits == cached
    assert second.block_table[: cached // 4] == first.block_table[: cached // 4]  # the very same blocks


def test_no_prefix_caching_means_no_hits() -> None:
    s = scheduler(prefix_caching=False)
    s.add(new_seq("first", list(range(1, 10))))
    run_step(s)
    s.add(new_seq("second", list(range(1, 10))))
    assert ("second", 9) in shape(run_step(s)[0])
    assert s.prefix_cache_hits_total == 0


# --- post-step bookkeeping --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "token", "reason", "stop_reason"),
    [
        (SamplingParams(stop_token_ids=[120]), 120, "stop", 120),
        (SamplingParams(), EOS, "stop", None),
        (SamplingParams(max_tokens=1, ignore_eos=True), 97, "length", None),
    ],
)
def test_postprocess_finishes_on_stop_tokens_eos_and_length(
    params: SamplingParams, token: int, reason: str, stop_reason: int | None
) -> None:
    s = scheduler()
    s.add(seq := new_seq("s", 5, params))
    free = s.block_manager.num_free_blocks
    _, updated = run_step(s, {"s": token})
    assert updated == [seq] and seq.output_token_ids == [token]
    assert (seq.finish_reason, seq.stop_reason) == (reason, stop_reason)
    assert seq.is_finished and seq not in s.running and seq.block_table == []
    assert s.block_manager.num_free_blocks == free
    out = seq.take_output().outputs[0]
    assert out.text == ("a" if token == 97 else "")  # a stop or end-of-sequence token adds no text


def test_eos_is_just_a_token_with_ignore_eos_and_max_total_tokens_ends_the_sequence() -> None:
    s = scheduler()
    s.add(seq := new_seq("s", 5, LONG, max_total=7))
    run_step(s, {"s": EOS})
    assert not seq.is_finished
    run_step(s, {"s": EOS})
    assert (seq.finish_reason, len(seq)) == ("length", 7)


@pytest.mark.parametrize("include", [False, True])
def test_a_stop_string_ends_the_text_before_or_after_it(include: bool) -> None:
    s = scheduler()
    params = SamplingParams(stop=["cd"], include_stop_str_in_output=include, max_tokens=100)
    s.add(seq := new_seq("s", 3, params))
    texts = []
    for token in b"abcde":
        if seq.is_finished:
            break
        run_step(s, {"s": token})
        texts.append(seq.take_output().outputs[0].text)
    assert (seq.finish_reason, seq.stop_reason) == ("stop", "cd")
    # without include, the newest character waits a step: it could be where the stop string begins
    assert texts == (["a", "b", "c", "d"] if include else ["", "a", "b", ""])


def test_a_sequence_whose_bookkeeping_raises_fails_alone() -> None:
    s = scheduler()
    s.add(good := new_seq("good", 3))
    s.add(bad := new_seq("bad", 3))

    class Broken:
        def add(self, token: int) -> str:
            raise UnicodeError("cannot decode")

    bad.detokenizer = Broken()  # type: ignore[assignment]
    _, updated = run_step(s)
    assert updated == [good, bad]
    assert (bad.finish_reason, bad.error) == ("error", "UnicodeError: cannot decode")
    assert bad.is_finished and bad.block_table == [] and bad.output_token_ids == [97]
    assert not good.is_finished and s.running == [good]


def test_fail_finishes_a_whole_step_with_the_error() -> None:
    s = scheduler()
    seqs = [new_seq(rid, 5) for rid in "ab"]
    for seq in seqs:
        s.add(seq)
    batch = s.schedule()
    assert s.fail([item.seq for item in batch], RuntimeError("device lost")) == seqs
    for seq in seqs:
        assert (seq.finish_reason, seq.error, seq.is_finished) == ("error", "RuntimeError: device lost", True)
        assert seq.take_output().error == "RuntimeError: device lost"
    assert not s.has_unfinished() and s.block_manager.num_free_blocks == 64


def test_finish_frees_running_and_waiting_sequences_alike() -> None:
    s = scheduler(max_num_seqs=1)
    s.add(running := new_seq("running", 9))
    s.add(waiting := new_seq("waiting", 9))
    run_step(s)
    assert running.status is SequenceStatus.RUNNING and waiting.status is SequenceStatus.WAITING
    assert s.block_manager.num_free_blocks == 64 - 3
    s.finish(waiting)
    s.finish(running)
    assert not s.has_unfinished() and s.block_manager.num_free_blocks == 64
    assert running.is_finished and waiting.is_finished


def grouped(group: str, k: int, prompt: int = 4) -> Sequence:
    seq = new_seq(f"{group}{k}", prompt)
    seq.group = group
    return seq


def test_waiting_queue_takes_requests_in_turns() -> None:
    # One request of 6 sequences arrives first; two later requests of 1 and 2 are not left behind it all.
    s = scheduler(max_num_seqs=1)
    for k in range(6):
        s.add(grouped("a", k))
    s.add(grouped("b", 0))
    s.add(grouped("c", 0))
    s.add(grouped("c", 1))
    assert [q.request_id for q in s.waiting] == ["a0", "b0", "c0", "a1", "c1", "a2", "a3", "a4", "a5"]


def test_turns_count_from_the_head_so_a_newcomer_does_not_jump_the_whole_queue() -> None:
    s = scheduler(max_num_seqs=2)
    for k in range(4):
        s.add(grouped("a", k))
    run_step(s)  # a0 and a1 are admitted: the head is now a2's turn
    for k in range(3):
        s.add(grouped("d", k))
    assert [q.request_id for q in s.waiting] == ["a2", "d0", "a3", "d1", "d2"]
    s.finish(s.waiting[1])  # an aborted waiting sequence leaves its group's count
    s.add(grouped("d", 3))
    assert [q.request_id for q in s.waiting] == ["a2", "a3", "d1", "d2", "d3"]


# --- the priority policy ------------------------------------------------------------------------------


def prioritised(rid: str, priority: int, prompt: int = 2) -> Sequence:
    seq = new_seq(rid, prompt)
    seq.priority = priority
    return seq


def test_the_waiting_queue_serves_lower_priority_values_first_and_turns_within_each() -> None:
    s = scheduler(max_num_seqs=1)
    for seq in (prioritised("batch0", 5), prioritised("std0", 0), grouped("s", 0), grouped("s", 1)):
        s.add(seq)
    s.add(prioritised("critical", -3))
    s.add(prioritised("batch1", 5))
    s.add(prioritised("std1", 0))
    assert [q.request_id for q in s.waiting] == ["critical", "std0", "s0", "std1", "s1", "batch0", "batch1"]
    batch, _ = run_step(s)
    assert shape(batch) == [("critical", 2)]


def test_under_kv_pressure_the_lowest_priority_is_preempted_even_if_admitted_first() -> None:
    s = scheduler(num_blocks=4)
    s.add(low := prioritised("low", 1, prompt=7))
    run_step(s)  # low runs alone: 2 blocks
    s.add(high := prioritised("high", 0, prompt=7))
    run_step(s)  # high joins: the cache is full
    assert [q.request_id for q in s.running] == ["high", "low"]  # higher priority first, whatever the admission
    # low's 9th token needs a third block: low goes itself (under fcfs high, admitted last, would make room)
    batch, _ = run_step(s)
    assert shape(batch) == [("high", 1)] and low.status is SequenceStatus.WAITING
    assert high.status is SequenceStatus.RUNNING
    s.add(mid := prioritised("mid", 0, prompt=2))
    s.add(low2 := prioritised("low2", 1, prompt=2))
    assert list(s.waiting) == [mid, low, low2]  # the preempted one at the head of its priority, behind the higher
    assert s.num_preemptions_total == 1


def test_a_higher_priority_takes_the_place_of_the_lowest_running_when_max_num_seqs_is_reached() -> None:
    s = scheduler(max_num_seqs=2)
    s.add(low := prioritised("low", 1))
    s.add(prioritised("std", 0))
    run_step(s)
    s.add(same := prioritised("same", 1))
    batch, _ = run_step(s)  # full, and "same" outranks nobody: it waits
    assert shape(batch) == [("std", 1), ("low", 1)] and same.status is SequenceStatus.WAITING
    s.add(prioritised("high", -1))
    batch, _ = run_step(s)  # full: the lowest running (low) makes room for high
    assert shape(batch) == [("std", 1), ("high", 2)]
    assert low.status is SequenceStatus.WAITING and list(s.waiting) == [low, same]  # low keeps its turn
    assert s.num_preemptions_total == 1


def test_a_higher_priority_that_finds_too_few_free_blocks_preempts_the_lowest_running() -> None:
    s = scheduler(num_blocks=4, max_num_seqs=8)
    s.add(low := prioritised("low", 1, prompt=12))  # 3 of the 4 blocks
    run_step(s)
    s.add(high := prioritised("high", 0, prompt=6))  # needs 2
    batch, _ = run_step(s)
    assert shape(batch) == [("high", 6)] and low.status is SequenceStatus.WAITING
    assert high.status is SequenceStatus.RUNNING


def test_under_fcfs_nothing_running_is_preempted_for_a_newcomer() -> None:
    s = scheduler(max_num_seqs=1)
    s.add(new_seq("first", 2))
    run_step(s)
    s.add(new_seq("second", 2))
    batch, _ = run_step(s)
    assert shape(batch) == [("first", 1)] and s.num_preemptions_total == 0
