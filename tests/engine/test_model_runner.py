"""`prepare_inputs`, the one layout of a step's tokens that the eager and the CUDA-graph paths both run."""

from __future__ import annotations

import torch

from folio.engine.model_runner import prepare_inputs
from folio.engine.sampling_params import SamplingParams
from folio.engine.scheduler import ScheduledSeq
from folio.engine.sequence import Sequence

BS = 4
CPU = torch.device("cpu")


def seq(tokens: int, computed: int, table: list[int]) -> Sequence:
    s = Sequence(f"s{tokens}-{computed}", None, list(range(100, 100 + tokens)), SamplingParams(), 1000, frozenset())
    s.num_computed_tokens, s.block_table = computed, table
    return s


def test_prefills_first_then_decodes_by_context_length() -> None:
    long_decode = ScheduledSeq(seq(10, 9, [7, 3, 5]), 1)
    chunk = ScheduledSeq(seq(12, 4, [2, 6, 8]), 5)  # a middle prefill chunk: positions 4..8, no sample
    short_decode = ScheduledSeq(seq(3, 2, [1]), 1)
    whole = ScheduledSeq(seq(3, 0, [4]), 3)  # a whole prompt: samples at its last token
    inputs = prepare_inputs([long_decode, chunk, short_decode, whole], BS, CPU)

    assert inputs.ordered == [chunk, whole, short_decode, long_decode]
    assert inputs.decodes == [short_decode, long_decode] and inputs.num_prefill_tokens == 8
    assert inputs.input_ids == [104, 105, 106, 107, 108, 100, 101, 102, 102, 109]
    assert inputs.positions == [4, 5, 6, 7, 8, 0, 1, 2, 2, 9]
    # slot = block_table[p // 4] * 4 + p % 4
    assert inputs.slots == [24, 25, 26, 27, 32, 16, 17, 18, 6, 21]
    assert inputs.context_lens == [9, 3, 3, 10]
    [seg_chunk, seg_whole] = inputs.prefills
    assert (seg_chunk.start, seg_chunk.end, seg_chunk.context_len) == (0, 5, 9)
    assert seg_chunk.block_table is not None and seg_chunk.block_table.tolist() == [2, 6, 8]  # cached prefix
    assert (seg_whole.start, seg_whole.end, seg_whole.context_len, seg_whole.block_table) == (5, 8, 3, None)
    assert inputs.sampling == [whole, short_decode, long_decode]
    assert inputs.logit_rows == [7, 8, 9]


def test_a_decode_only_step_is_the_graph_paths_input() -> None:
    a, b = ScheduledSeq(seq(6, 5, [3, 9]), 1), ScheduledSeq(seq(2, 1, [4]), 1)
    inputs = prepare_inputs([a, b], BS, CPU)
    assert inputs.ordered == [b, a] and inputs.prefills == [] and inputs.num_prefill_tokens == 0
    assert (inputs.input_ids, inputs.positions, inputs.slots, inputs.context_lens) == (
        [101, 105], [1, 5], [17, 37], [2, 6]
    )
    assert inputs.logit_rows == [0, 1]


def test_a_verify_steps_positions_are_decode_rows_among_the_others() -> None:
    """A sequence verifying 2 proposals: its last token and each proposal a decode row of its own (context
    up to and including it), consecutive (the native kernel reads their context once), placed among the
    other decodes by its first position; its logit rows in position order."""
    from folio.engine.model_runner import DraftRow

    verifying = ScheduledSeq(seq(6, 5, [3, 9]), 3, [7, 8])  # positions 5, 6, 7
    other = ScheduledSeq(seq(7, 6, [4, 1]), 1)  # position 6
    inputs = prepare_inputs([verifying, other], BS, CPU)
    assert inputs.prefills == [] and inputs.sampling == [verifying, other]
    assert [(type(r).__name__, r.start) for r in inputs.ordered] == [
        ("DraftRow", 5), ("DraftRow", 6), ("DraftRow", 7), ("ScheduledSeq", 6)]
    assert all(r.item is verifying for r in inputs.ordered if isinstance(r, DraftRow))
    assert inputs.input_ids == [105, 7, 8, 106] and inputs.positions == [5, 6, 7, 6]
    assert inputs.slots == [37, 38, 39, 6] and inputs.context_lens == [6, 7, 8, 7]
    assert inputs.logit_rows == [0, 1, 2, 3] and inputs.rows_in_order
    # a decode before it keeps its place: rows go by each sequence's first position
    early = ScheduledSeq(seq(3, 2, [5]), 1)  # position 2
    inputs = prepare_inputs([verifying, other, early], BS, CPU)
    assert [r.start for r in inputs.ordered] == [2, 5, 6, 7, 6] and inputs.sampling == [early, verifying, other]
    assert inputs.logit_rows == [0, 1, 2, 3, 4]
