"""The sampler's batched paths: penalties for a whole batch at once equal each row's own arithmetic, top-k
(with or without top-p) through ``topk`` equals the full-vocabulary sort, and greedy decoding picks from
logits in the model's dtype what it picks from their float32 copy."""

from __future__ import annotations

import torch

from folio.engine.sampler import Sampler, _top_k_top_p
from folio.engine.sampling_params import SamplingParams
from folio.engine.sequence import Sequence


def _seq(prompt: list[int], output: list[int], **params: float) -> Sequence:
    seq = Sequence("x", None, prompt, SamplingParams(**params), 100, frozenset())
    seq.token_ids += output
    return seq


def one_row(row: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """The penalties of one sequence, written out the obvious way."""
    p, vocab = seq.params, row.shape[0]
    counts = torch.zeros(vocab)
    for t in seq.output_token_ids:
        if t < vocab:
            counts[t] += 1
    seen = counts > 0
    for t in seq.prompt_token_ids:
        if t < vocab:
            seen[t] = True
    penalised = torch.where(row > 0, row / p.repetition_penalty, row * p.repetition_penalty)
    row = torch.where(seen, penalised, row)
    return row - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).float()


def test_batched_penalties_equal_each_rows_own() -> None:
    torch.manual_seed(0)
    vocab = 50
    seqs = [
        _seq([1, 2, 3], [4, 4, 5], repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2),
        _seq([7], [], temperature=0.0),                                        # not penalised: untouched
        _seq([9, 9, 60], [9, 70, 11, 11, 11], frequency_penalty=-0.5),          # ids past the vocabulary
        _seq(list(range(40)), [0], repetition_penalty=0.7),
        _seq([2], [3], presence_penalty=1.5),
    ]
    logits = torch.randn(len(seqs), vocab) * 3
    got = Sampler._apply_penalties(logits, seqs)
    for i, seq in enumerate(seqs):
        want = one_row(logits[i], seq) if seq.params.has_penalties else logits[i]
        torch.testing.assert_close(got[i], want)


def test_top_k_through_topk_equals_the_full_sort() -> None:
    torch.manual_seed(1)
    probs = torch.softmax(torch.randn(4, 300) * 2, dim=-1)
    top_k, top_p = [5, 40, 1, 17], [1.0, 0.6, 0.9, 0.3]
    fast = _top_k_top_p(probs, top_k, top_p)                  # every row has a k: topk of the widest
    full = _top_k_top_p(probs, [*top_k[:3], 0], [*top_p[:3], 0.3])  # a row without k: the full sort
    torch.testing.assert_close(fast[:3], full[:3])
    assert set(fast[0].nonzero().flatten().tolist()) == set(probs[0].topk(5).indices.tolist())
    assert int((fast[2] > 0).sum()) == 1 and 0 < int((fast[3] > 0).sum()) <= 17


def test_greedy_picks_the_same_from_the_models_dtype_as_from_float32() -> None:
    torch.manual_seed(2)
    logits = (torch.randn(6, 3000) * 4).to(torch.bfloat16)
    logits[0, 10] = logits[0, 20] = 50  # a tie: the first maximum, on either path
    sampler = Sampler(0, torch.device("cpu"))
    plain = [_seq([1], [], temperature=0.0) for _ in range(6)]
    fast = sampler(logits, plain)  # nothing asks for float32: picked from the bfloat16 rows as they are
    assert fast.token_ids == logits.float().argmax(dim=-1).tolist() and fast.token_ids[0] == 10
    assert fast.logprobs == [None] * 6 and fast.sampled_logprobs == [0.0] * 6
    with_logprobs = [*plain[:5], _seq([1], [], temperature=0.0, logprobs=2)]  # widened first, same tokens
    result = sampler(logits, with_logprobs)
    assert result.token_ids == fast.token_ids and result.logprobs[5] is not None
    assert sampler(logits.float(), plain).token_ids == fast.token_ids
