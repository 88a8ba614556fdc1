"""Sampling: seeds, top-k/top-p/min-p, penalties, stop strings and tokens, max_tokens, logprobs."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from folio.engine import LLM, SamplingParams
from folio.engine.sampler import Sampler, _top_k_top_p
from folio.engine.sequence import Sequence

PROMPT = [1, 17, 42, 99, 123, 7, 300, 12]


@pytest.fixture(scope="module")
def llm(tiny_llama: Path) -> LLM:
    return LLM(str(tiny_llama))


def _tokens(llm: LLM, params: SamplingParams, prompt: list[int] = PROMPT) -> list[int]:
    return llm.generate([prompt], params)[0].outputs[0].token_ids


def test_seed_reproduces_regardless_of_batch(llm: LLM) -> None:
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=16, ignore_eos=True)
    alone = _tokens(llm, params)
    g = torch.Generator().manual_seed(0)
    company = [torch.randint(3, 512, (int(n),), generator=g).tolist() for n in torch.randint(1, 80, (8,), generator=g)]
    others = [SamplingParams(temperature=0.8, seed=None if i % 2 else i, max_tokens=20, ignore_eos=True) for i in range(8)]
    outs = llm.generate([*company[:4], PROMPT, *company[4:]], [*others[:4], params, *others[4:]])
    assert outs[4].outputs[0].token_ids == alone
    assert _tokens(llm, SamplingParams(temperature=1.0, seed=1235, max_tokens=16, ignore_eos=True)) != alone


def test_top_k_1_is_greedy(llm: LLM) -> None:
    greedy = _tokens(llm, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    assert _tokens(llm, SamplingParams(temperature=1.5, top_k=1, max_tokens=12, ignore_eos=True)) == greedy
    assert _tokens(llm, SamplingParams(temperature=1.0, min_p=1.0, max_tokens=12, ignore_eos=True)) == greedy


def test_n_fans_out_with_consecutive_seeds(llm: LLM) -> None:
    out = llm.generate([PROMPT], SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True))[0]
    assert [c.index for c in out.outputs] == [0, 1]
    for i, completion in enumerate(out.outputs):
        assert completion.token_ids == _tokens(llm, SamplingParams(temperature=1.0, seed=7 + i, max_tokens=8, ignore_eos=True))


def test_max_tokens_and_stop_token_ids(llm: LLM) -> None:
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 10 and out.finish_reason == "length" and out.stop_reason is None
    stop_id = out.token_ids[5]
    first = out.token_ids.index(stop_id)
    stopped = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=10, stop_token_ids=[stop_id]))[0].outputs[0]
    assert stopped.token_ids == out.token_ids[: first + 1]
    assert (stopped.finish_reason, stopped.stop_reason) == ("stop", stop_id)


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings(llm: LLM, include: bool) -> None:
    full = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))[0].outputs[0].text
    stop = full[10:13]
    assert stop and "\ufffd" not in stop
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=[stop, "never-there"],
                            include_stop_str_in_output=include)
    out = llm.generate([PROMPT], params)[0].outputs[0]
    end = full.index(stop) + (len(stop) if include else 0)
    assert out.text == full[:end]
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)


def test_stop_string_is_never_streamed_before_it_is_ruled_out(llm: LLM) -> None:
    full = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))[0].outputs[0].text
    stop = full[10:13]
    eng = llm.llm_engine
    eng.add_request("stream", PROMPT, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop=[stop]))
    deltas = []
    while eng.has_unfinished_requests():
        deltas += [o.outputs[0].text for o in eng.step()]
    texts = list(itertools.accumulate(deltas))  # what a client has seen after each step
    for earlier, later in itertools.pairwise(texts):
        assert later.startswith(earlier)  # streamed text only ever grows
    assert texts[-1] == full[: full.index(stop)]


def test_logprobs(llm: LLM) -> None:
    out = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3))[0].outputs[0]
    assert out.logprobs is not None and len(out.logprobs) == 6
    total = 0.0
    for token, entry in zip(out.token_ids, out.logprobs, strict=True):
        assert token in entry and 3 <= len(entry) <= 4
        assert entry[token] == pytest.approx(max(entry.values()))  # greedy picks the most likely
        assert all(v <= 0 for v in entry.values())
        total += entry[token]
    assert out.cumulative_logprob == pytest.approx(total)
    plain = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=6))[0].outputs[0]
    assert plain.logprobs is None and plain.cumulative_logprob is None


def _seq(prompt: list[int], output: list[int], **params) -> Sequence:
    seq = Sequence("x", None, prompt, SamplingParams(**params), 100, frozenset())
    seq.token_ids += output
    return seq


def test_penalties_arithmetic() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, 3.0]])
    seq = _seq([0, 1], [2, 2, 3], repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    got = Sampler._apply_penalties(logits, [seq])
    # repetition: tokens 0-3 seen (prompt or output); positive /2, negative *2
    # frequency 0.5 * count and presence 0.25 for output tokens 2 (x2) and 3 (x1)
    want = torch.tensor([[1.0, -4.0, 0.5 - 1.0 - 0.25, 0.25 - 0.5 - 0.25, 3.0]])
    assert torch.allclose(got, want)
    assert torch.equal(logits, torch.tensor([[2.0, -2.0, 1.0, 0.5, 3.0]]))  # input untouched


def test_top_k_top_p_filtering() -> None:
    probs = torch.tensor([[0.1, 0.5, 0.05, 0.35], [0.1, 0.5, 0.05, 0.35]])
    out = _top_k_top_p(probs, [-1, 1], [0.8, 1.0])
    # row 0: top-p 0.8 keeps 0.5 and 0.35 (the token crossing 0.8 stays); row 1: top-k 1
    assert torch.equal(out > 0, torch.tensor([[False, True, False, True], [False, True, False, False]]))


def test_sampling_follows_the_distribution() -> None:
    sampler = Sampler(0, torch.device("cpu"))
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    seqs = [_seq([0], [], temperature=1.0)]
    counts = torch.zeros(3)
    for _ in range(2000):
        counts[sampler(logits, seqs).token_ids[0]] += 1
    assert torch.allclose(counts / 2000, torch.tensor([0.7, 0.2, 0.1]), atol=0.04)


def test_tokens_filtered_out_are_never_drawn() -> None:
    # top-k 2 of 5 leaves tokens 1 and 3; the first and the last token, and one between, have probability 0
    sampler = Sampler(1, torch.device("cpu"))
    logits = torch.log(torch.tensor([[0.15, 0.5, 0.1, 0.2, 0.05]] * 4))
    seqs = [_seq([0], [], temperature=1.0, top_k=2) for _ in range(4)]
    counts = torch.zeros(5)
    for _ in range(500):
        for token in sampler(logits, seqs).token_ids:
            counts[token] += 1
    assert counts[[0, 2, 4]].sum() == 0
    assert torch.allclose(counts[[1, 3]] / 2000, torch.tensor([0.5 / 0.7, 0.2 / 0.7]), atol=0.04)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_k": -3}, "top_k"),
        ({"min_p": 2.0}, "min_p"),
        ({"n": 0}, "n"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"temperature": math.nan}, "temperature"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_sampling_params(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name) as err:
        SamplingParams(**kwargs)
    assert repr(next(iter(kwargs.values()))) in str(err.value)
