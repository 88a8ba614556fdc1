"""Speculative decoding in the engine: exact greedy output across the families, the target's distribution
under sampling, the block manager's invariants after every step, logprobs, stops, seeds, back-off."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from folio.engine import LLM, SamplingParams
from folio.engine.block_manager import BlockManager
from folio.engine.config import ConfigValueError, EngineConfig
from folio.engine.llm_engine import LLMEngine
from folio.engine.sampling_params import SamplingParams as Params
from folio.engine.sequence import Sequence
from folio.engine.spec_decode.config import SpeculativeConfig
from folio.engine.spec_decode.speculator import (
    EXPLORE_EVERY,
    MIN_GAIN,
    MIN_KEPT,
    Speculator,
    StepCosts,
    share,
)
from tests.engine.test_families import FAMILIES
from tests.support.models import make_tiny_llama

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def repetitive_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    """Prompts that repeat a phrase (so prompt lookup finds proposals), of several lengths."""
    g = torch.Generator().manual_seed(seed)
    phrases = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (3, 6, 9, 13)]
    return [phrase * reps for phrase, reps in zip(phrases, (5, 3, 4, 2), strict=True)]


def run_checked(engine: LLMEngine, prompts: list[list[int]], params: list[Params]) -> list[list[int]]:
    """Each prompt's output tokens, stepping the engine by hand and checking the block manager (and a draft
    model's) after each step."""
    for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(str(i), prompt, p)
    tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.outputs[0].token_ids
        engine.block_manager.check(engine.scheduler.running)
        if engine.draft is not None:
            engine.draft.check()
    return [tokens[str(i)] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def family_path(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in cache:
            options = {} if name == "llama" else FAMILIES[name]
            cache[name] = make_tiny_llama(tmp_path_factory.mktemp(name), randomize_norms=True, **options)
        return cache[name]

    return build


@pytest.mark.parametrize("family", ["llama", *FAMILIES])
def test_greedy_output_is_token_identical_with_speculation(family_path, family: str) -> None:
    """Every family, float32: the same tokens with prompt lookup as without, through stops of every kind
    (max_tokens, a stop token, a short max_tokens that ends mid-proposal), with the block manager's
    invariants holding after every step."""
    path = family_path(family)
    prompts = repetitive_prompts(512)
    plain = Params(temperature=0.0, max_tokens=32)
    params = [plain, Params(temperature=0.0, max_tokens=5), plain, Params(temperature=0.0, max_tokens=32)]
    base = LLMEngine(EngineConfig(str(path), dtype="float32", device="cpu"))
    want = run_checked(base, prompts, params)
    base.close()
    # a stop token the output reaches, so that one answer stops inside a verify step
    params[2] = Params(temperature=0.0, max_tokens=32, stop_token_ids=[want[2][9]])
    want[2] = want[2][: want[2].index(want[2][9]) + 1]
    spec = LLMEngine(EngineConfig(str(path), dtype="float32", device="cpu", speculative_config=NGRAM))
    got = run_checked(spec, prompts, params)
    stats = spec.stats().spec_decode
    spec.close()
    assert got == want
    assert stats is not None and stats.num_drafts > 0 and stats.num_accepted_tokens > 0


@pytest.mark.parametrize("decode_path", ["kernels", "gather"])
def test_verify_rows_read_the_cache_alike_on_every_decode_path(family_path, decode_path: str) -> None:
    """The verify step's rows are decode rows: on the `folio.kernels` path (what CUDA runs; here their PyTorch
    twins) and on the CPU's gather + SDPA fallback too, the output is the same as without speculation."""
    path = family_path("llama")
    prompts = repetitive_prompts(512, seed=2)
    params = SamplingParams(temperature=0.0, max_tokens=24)
    want = [o.outputs[0].token_ids for o in LLM(str(path), dtype="float32", device="cpu").generate(prompts, params)]
    llm = LLM(str(path), dtype="float32", device="cpu", enforce_eager=True, speculative_config=NGRAM)
    runner = llm.llm_engine.runner
    if decode_path == "kernels":
        runner.use_kernels = True
        runner.model.use_kernels(True)
    else:
        runner.native_decode = False
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == want
    assert llm.llm_engine.stats().spec_decode.num_accepted_tokens > 0


def test_verify_steps_run_on_the_cpu_step_graphs(family_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A verify step holds a row per proposal besides each sequence's own: the CPU step graphs take steps of up
    to max_num_seqs × (1 + k) rows, so verify steps replay graphs instead of running eagerly."""
    from folio.engine.cpu_graphs import CpuDecodeGraphs

    path = family_path("llama")
    prompts = repetitive_prompts(512, seed=3)
    params = SamplingParams(temperature=0.0, max_tokens=32)
    want = [o.outputs[0].token_ids for o in LLM(str(path), dtype="float32", device="cpu").generate(prompts, params)]
    llm = LLM(str(path), dtype="float32", device="cpu", max_num_seqs=2, speculative_config=NGRAM)
    graphs = llm.llm_engine.runner.decode_graphs
    assert isinstance(graphs, CpuDecodeGraphs) and graphs.max_batch_size == 2 * (1 + NGRAM["num_speculative_tokens"])
    rows: list[int] = []
    run = CpuDecodeGraphs.run

    def counted(self: CpuDecodeGraphs, *step: torch.Tensor | None) -> torch.Tensor:
        assert step[0] is not None
        rows.append(step[0].shape[0])
        return run(self, *step)

    monkeypatch.setattr(CpuDecodeGraphs, "run", counted)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == want
    assert max(rows) > 2, rows  # verify steps of more rows than sequences went through the graphs


def test_logprobs_and_stop_strings_as_without_speculation(family_path) -> None:
    path = family_path("llama")
    prompts = repetitive_prompts(512, seed=1)
    params = SamplingParams(temperature=0.0, max_tokens=24, logprobs=3)
    base = LLM(str(path), dtype="float32", device="cpu").generate(prompts, params)
    spec_llm = LLM(str(path), dtype="float32", device="cpu", speculative_config=NGRAM)
    spec = spec_llm.generate(prompts, params)
    assert spec_llm.llm_engine.stats().spec_decode.num_accepted_tokens > 0
    for a, b in zip(base, spec, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].text == b.outputs[0].text
        for top_a, top_b in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert top_a.keys() == top_b.keys()
            assert all(abs(top_a[t] - top_b[t]) < 1e-4 for t in top_a)
        assert b.outputs[0].cumulative_logprob == pytest.approx(a.outputs[0].cumulative_logprob, abs=1e-3)
    # a stop string met inside the kept proposals ends the answer there, as it does without them
    text = base[0].outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    if stop.strip():
        params = SamplingParams(temperature=0.0, max_tokens=24, stop=[stop])
        assert spec_llm.generate(prompts[:1], params)[0].outputs[0].text == (
            LLM(str(path), dtype="float32", device="cpu").generate(prompts[:1], params)[0].outputs[0].text
        )


def _samples(path: Path, prompt: list[int], n: int, **engine: Any) -> Counter[tuple[int, ...]]:
    llm = LLM(str(path), dtype="float32", device="cpu", seed=1, **engine)
    params = SamplingParams(temperature=1.0, top_k=2, max_tokens=4)
    outs = llm.generate([prompt] * n, params)
    if engine:
        stats = llm.llm_engine.stats().spec_decode
        assert stats is not None and 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # kept and refused
    return Counter(tuple(o.outputs[0].token_ids) for o in outs)


def test_sampling_keeps_the_targets_distribution(family_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4-token answers drawn 2,000 times with and without proposals: each position's token follows the same
    distribution (total variation of the two samples under 0.08, about 0.03 expected by chance alone; a
    sampler that kept every proposal, or drew corrections from the target itself, is several times further
    off)."""
    monkeypatch.setattr(Speculator, "step_budget", lambda self, n, lengths: sum(lengths))  # speculate in the whole batch
    path = family_path("llama")
    # the model's own greedy continuation as the prompt's end: what it samples next often occurred in it
    seed = repetitive_prompts(512)[0]
    greedy = LLM(str(path), dtype="float32", device="cpu").generate([seed], SamplingParams(temperature=0.0, max_tokens=40))
    prompt = seed + greedy[0].outputs[0].token_ids
    n = 2000
    base = _samples(path, prompt, n)
    spec = _samples(path, prompt, n, speculative_config=NGRAM)
    for position in range(4):
        a = Counter(t[position] for t in base.elements() if len(t) > position)
        b = Counter(t[position] for t in spec.elements() if len(t) > position)
        tv = 0.5 * sum(abs(a[k] / a.total() - b[k] / b.total()) for k in a.keys() | b.keys())
        assert tv < 0.08, (position, tv, a.most_common(5), b.most_common(5))


def test_a_seeded_request_gives_the_same_answer_every_run(family_path) -> None:
    path = family_path("llama")
    prompt = repetitive_prompts(512)[0]
    params = SamplingParams(temperature=0.8, max_tokens=24, seed=1234)
    runs = [LLM(str(path), dtype="float32", device="cpu", speculative_config=NGRAM).generate([prompt], params)
            for _ in range(2)]  # fmt: skip
    assert runs[0][0].outputs[0].token_ids == runs[1][0].outputs[0].token_ids


# --- the speculator on its own ------------------------------------------------------------------------------


def _seq(tokens: list[int], max_tokens: int = 100, **params: Any) -> Sequence:
    p = Params(max_tokens=max_tokens, **params)
    return Sequence("r", None, tokens, p, max_total_tokens=len(tokens) + max_tokens, eos_token_ids=frozenset())


def _propose(spec: Speculator, seq: Sequence, room: int) -> list[int]:
    """A step's proposals for ``seq`` alone, as the scheduler asks: `plan`, then `draft`."""
    spec.plan([seq], room)
    return spec.draft(seq, room)


def test_a_sequence_whose_proposals_are_refused_pauses_longer_each_time() -> None:
    spec = Speculator(SpeculativeConfig.parse(NGRAM))
    seq = _seq([1, 2, 3, 1, 2, 3, 1, 2])
    pauses, run = [], 0
    for _ in range(300):  # every proposal refused
        draft = _propose(spec, seq, room=10)
        if not draft:
            run += 1
            continue
        if run:
            pauses.append(run)
            run = 0
        spec.verified(seq, len(draft), 0)
    assert len(pauses) >= 4 and pauses == sorted(pauses) and pauses[-1] > 2 * pauses[0], pauses
    assert spec.stats.num_accepted_tokens == 0 < spec.stats.num_drafts
    assert MIN_KEPT > 0


def test_proposals_stay_within_the_answer_the_room_and_the_step_budget() -> None:
    spec = Speculator(SpeculativeConfig.parse(NGRAM))
    tokens = [5, 6, 7, 8] * 4
    assert len(_propose(spec, _seq(tokens, max_tokens=3), room=10)) == 2  # the last token is the target's own
    assert _propose(spec, _seq(tokens, max_tokens=1), room=10) == []
    assert len(_propose(spec, _seq(tokens), room=1)) == 1
    assert _propose(spec, _seq(tokens, repetition_penalty=1.2), room=10) == []  # penalties: one token at a time
    # a step's budget goes round the sequences a position at a time; `draft` cuts to the room left
    first, second, third = _seq(tokens), _seq(tokens), _seq(tokens)
    spec.plan([first, second, third], 7)
    assert [len(spec.draft(first, 10)), len(spec.draft(second, 10)), len(spec.draft(third, 1))] == [3, 2, 1]


def test_a_sequence_without_a_match_leaves_its_share_of_the_budget_to_the_others() -> None:
    # Prompt lookup proposes first (a lookup costs nothing) and the budget goes round the proposals there are:
    # the second sequence's context repeats nothing, so the first's second and third proposals get its rows.
    spec = Speculator(SpeculativeConfig.parse(NGRAM))
    first, novel, third = _seq([5, 6, 7, 8] * 4), _seq(list(range(100, 116))), _seq([9, 10, 11, 12] * 4)
    spec.plan([first, novel, third], 5)
    assert [len(spec.draft(s, 10)) for s in (first, novel, third)] == [3, 0, 2]
    assert share([4, 0, 1, 3], 6) == [3, 0, 1, 2] and share([2, 2], 9) == [2, 2] and share([], 3) == []


class _CountingDraft:
    """A draft model's side of the protocol (not cheap): proposes what it is asked for, and counts it."""

    cheap = False

    def __init__(self) -> None:
        self.asked: list[list[int]] = []

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        self.asked.append(ks)
        return [[1] * k for k in ks]

    def forget(self, seq: Sequence) -> None:
        pass


def test_a_draft_model_proposes_only_what_the_budget_takes() -> None:
    draft = _CountingDraft()
    spec = Speculator(SpeculativeConfig.parse(NGRAM), proposer=draft)
    seqs = [_seq([5, 6, 7, 8] * 4) for _ in range(3)]
    spec.plan(seqs, 5)
    assert draft.asked == [[2, 2, 1]]  # its K steps run for these, not for the 4 each would take
    assert [len(spec.draft(s, 10)) for s in seqs] == [2, 2, 1]


def test_a_step_gets_the_proposals_that_give_it_the_most_tokens_per_second() -> None:
    """A machine where a step reads the weights (20 ms) and then pays 1 ms a row past 8 rows. With 3 of 4
    proposals kept at every position: a batch of 16 (28 ms, 1.75 ms a token) proposes all it may, since a kept
    proposal costs 1 ms / 0.75; a batch of 64 (76 ms, 1.19 ms a token) nothing. With proposals rarely kept,
    only the rows that cost nothing. Where later positions are kept less, a batch of 8 stops where one more
    position would cost more than it brings: two proposals each. Sizes never seen let a step propose (so that
    they get known)."""
    spec = Speculator(SpeculativeConfig.parse(NGRAM))
    assert spec.step_budget(2) == 8  # nothing known yet
    for rows in (1, 2, 4, 8, 16, 32, 64, 128):
        for _ in range(3):
            spec.step_ran(rows, 0.020 + 0.001 * max(0, rows - 8))
    spec.kept_at = [0.75] * 4
    assert spec.step_budget(1) == 4 and spec.step_budget(16) == 64
    assert spec.step_budget(64) == 0
    spec.kept_at = [0.05] * 4  # proposals rarely kept: only where a row is free
    assert spec.step_budget(8) == 0 and spec.step_budget(2) == 6  # 8 rows cost one; the 9th 1 ms for 0.05 token
    spec.kept_at = [0.9, 0.6, 0.3, 0.1]
    # 8 rows: 15.2 tokens in 28 ms; 16: 20 in 36 ms (the best); 24: 22.4 in 44 ms; 32: 23.2 in 52 ms
    assert spec.step_budget(8) == 16
    assert spec.costs.cost(3) == pytest.approx(0.020) and spec.costs.cost(200) == pytest.approx(0.212)
    # Only 2 of the 8 have proposals (the others' contexts repeat nothing): their rows sit at positions 0, 0,
    # 1, 1, 2, 2, ...; two positions pay (11 tokens in 24 ms), a third (kept 30%) does not, where 8 sequences
    # with proposals each took two positions above.
    assert spec.step_budget(8, [4, 0, 0, 4, 0, 0, 0, 0]) == 4
    assert spec.step_budget(8, [0] * 8) == 0 and spec.step_budget(8, [1, 1]) == 2


def test_a_slow_sample_past_a_steps_size_does_not_keep_proposals_off_for_good() -> None:
    """Costs past the sizes seen are extrapolated: one slow step of 9 rows makes proposals for 8 sequences look
    too dear, and a budget that never ran larger would never learn otherwise. One short step in EXPLORE_EVERY
    proposes one position more; once that size is measured cheap, the steps propose."""
    spec = Speculator(SpeculativeConfig.parse(NGRAM))
    spec.kept_at = [0.9] * 4
    for _ in range(3):
        spec.step_ran(8, 0.020)
    spec.step_ran(9, 0.030)  # an outlier: 10 ms for a row
    budgets = [spec.step_budget(8) for _ in range(EXPLORE_EVERY)]
    assert budgets == [0] * (EXPLORE_EVERY - 1) + [8], "one step in EXPLORE_EVERY finds out"
    for _ in range(3):
        spec.step_ran(16, 0.024)  # what that step (and the next ones like it) measured: 0.5 ms a row
    assert spec.step_budget(8) > 0


def test_proposals_at_break_even_are_not_made() -> None:
    """A compute-bound batch, where a row costs what a kept proposal brings: the learnt costs promising a few
    percent more tokens a second are within their own noise, and proposals must promise MIN_GAIN."""
    spec = Speculator(SpeculativeConfig.parse(NGRAM))
    spec.kept_at = [1.0] * 4
    for rows in (16, 32):  # 16 decoding sequences: 16 ms; each row past them 1 ms for a kept token
        for _ in range(3):
            spec.step_ran(rows, 0.016 + 0.001 * (rows - 16))
    assert spec.step_budget(16) == 0
    for _ in range(StepCosts.WINDOW):
        spec.step_ran(32, 0.016 * 1.8)  # twice the tokens for 1.8x the time: 11% more
    assert MIN_GAIN < 0.11 and spec.step_budget(16) > 0


def test_kept_proposals_are_counted_by_position() -> None:
    spec = Speculator(SpeculativeConfig.parse(NGRAM))
    seq = _seq([5, 6, 7, 8] * 4)
    spec.plan([seq], 4)
    spec.draft(seq, 4)
    for _ in range(40):
        spec.verified(seq, 3, 1)  # three proposed, the first kept
    assert spec.kept_at[0] > 0.95 and spec.kept_at[1] < 0.05 and spec.kept_at[2] < 0.05
    assert spec.kept_at[3] == 0.5, "never proposed at the fourth position: still the prior"


def test_trimming_returns_a_refused_proposals_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    seq = _seq(list(range(10)))
    assert bm.allocate(seq, 10)
    seq.num_computed_tokens = 9  # the last token not computed yet: a verify step of 1 + 4 proposals
    assert bm.allocate(seq, 5) and len(seq.block_table) == 4  # positions 9-13: one more block
    bm.check([seq])
    bm.trim(seq, len(seq) + 1)  # one proposal kept
    assert len(seq.block_table) == 3 and bm.num_free_blocks == 5
    bm.check([seq])


def test_a_trimmed_table_is_read_afresh_by_the_block_tables_mirror() -> None:
    """Verify positions read the paged cache through the mirrored block tables: a table trimmed and grown
    again with another block must not be read as the old one."""
    from folio.engine.block_tables import BlockTables
    from folio.engine.scheduler import ScheduledSeq

    bm, tables = BlockManager(num_blocks=8, block_size=4), BlockTables(4, torch.device("cpu"))
    seq = _seq(list(range(10)))
    assert bm.allocate(seq, 10)
    seq.num_computed_tokens = 9
    assert bm.allocate(seq, 5)
    assert tables.host([ScheduledSeq(seq, 5)], [14])[0].tolist() == seq.block_table
    trimmed = seq.block_table[3]
    bm.trim(seq, 11)
    assert bm.allocate(_seq([1]), 4) and bm.allocate(seq, 5)  # another block now at index 3
    assert seq.block_table[3] != trimmed
    assert tables.host([ScheduledSeq(seq, 5)], [14])[0].tolist() == seq.block_table


# --- configuration ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"model": "", "num_speculative_tokens": 3}, "a draft model needs 'model'"),
        ({"model": "/models/draft", "num_speculative_tokens": 3, "prompt_lookup_max": 2}, "for method ngram only"),
        ({"method": "ngram", "num_speculative_tokens": 40}, "from 1 to 16"),
        ("{oops", "not valid JSON"),
    ],
)
def test_a_speculative_config_the_engine_cannot_run_is_refused(value: Any, message: str) -> None:
    with pytest.raises(ConfigValueError, match=message) as info:
        EngineConfig("m", speculative_config=value)
    assert info.value.field == "speculative_config"


def test_folio_serve_refuses_a_bad_speculative_config_naming_the_flag() -> None:
    import argparse

    from folio.engine import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args(["--model", "m", "--speculative-config", '{"method": "ngram"}'])
    with pytest.raises(serve_cli.FlagError, match="num_speculative_tokens is required") as info:
        serve_cli.check(args)
    assert info.value.dest == "speculative_config"
    config, _ = serve_cli.check(parser.parse_args(["--model", "m", "--speculative-config", '{"method": "ngram", '
                                                   '"num_speculative_tokens": 3}']))  # fmt: skip
    assert config.speculative is not None and config.speculative.num_speculative_tokens == 3


def test_the_counters_are_exported_under_vllms_names() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from folio.engine.outputs import EngineStats
    from folio.engine.server.metrics import _EngineStatsCollector
    from folio.engine.spec_decode.speculator import SpecDecodeStats

    spec = SpecDecodeStats(num_drafts=5, num_draft_tokens=12, num_accepted_tokens=7, accepted_per_position=[4, 2, 1])
    stats = EngineStats(0, 0, 0.0, 0, 0, 0, spec_decode=spec)
    registry = CollectorRegistry()
    registry.register(_EngineStatsCollector("m", lambda: stats))
    text = generate_latest(registry).decode()
    for line in ('vllm:spec_decode_num_drafts_total{model_name="m"} 5.0',
                 'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 12.0',
                 'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 7.0',
                 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 2.0'):  # fmt: skip
        assert line in text, line
    assert spec.acceptance_rate == 7 / 12 and spec.mean_accepted_length == 1 + 7 / 5
    without = EngineStats(0, 0, 0.0, 0, 0, 0)
    registry = CollectorRegistry()
    registry.register(_EngineStatsCollector("m", lambda: without))
    assert "spec_decode" not in generate_latest(registry).decode()


def test_smollm2_greedy_is_token_identical_on_an_input_grounded_prompt(smollm2_dir: Path) -> None:
    """SmolLM2, float32: a prompt that quotes a passage and asks for it again; prompt lookup proposes from the
    passage and the answer is the same, token for token."""
    passage = ("The quick brown fox jumps over the lazy dog. The dog, being lazy, does not jump back; it "
               "watches the fox run into the forest, where the trees are tall and the paths are narrow.")  # fmt: skip
    prompt = f"Passage: {passage}\nRepeat the passage exactly.\nPassage: "
    params = SamplingParams(temperature=0.0, max_tokens=48)
    want = LLM(str(smollm2_dir), dtype="float32", device="cpu").generate([prompt], params)[0].outputs[0]
    llm = LLM(str(smollm2_dir), dtype="float32", device="cpu", speculative_config=NGRAM)
    got = llm.generate([prompt], params)[0].outputs[0]
    assert got.token_ids == want.token_ids and got.text == want.text
    stats = llm.llm_engine.stats().spec_decode
    assert stats is not None and stats.mean_accepted_length > 1.5, stats
