"""Tensor parallelism on the CPU with gloo: TP=2 token-exact against TP=1 and `transformers`; sharded
loading reads only each rank's bytes; the step mirror and the sharding arithmetic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from folio.engine import LLM, SamplingParams
from folio.engine.config import EngineConfig
from folio.engine.distributed.sharding import (
    ParamShard,
    TensorParallel,
    check_shardable,
    kv_heads,
    vocab_rows,
)
from folio.engine.loader import load_model, load_model_config
from tests.engine.test_families import FAMILIES
from tests.engine.test_hf_equivalence import hf_greedy, random_prompts
from tests.support.models import make_tiny_llama

MAX_TOKENS = 8
ENGINE = {"dtype": "float32", "max_model_len": 256, "kv_cache_memory_gib": 0.02}

# KV heads fewer than ranks (1 KV head, replicated on both), untied LM head, a vocabulary that does not
# split evenly (509 rows: 255 + 254); and a tied one with two KV heads, one per rank.
MODELS: dict[str, dict[str, Any]] = {
    "kv1-untied": {"num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 509},
    "kv2-tied": {"num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True},
}


@pytest.fixture(scope="module")
def tp_model(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in cache:
            settings = MODELS[name] if name in MODELS else FAMILIES[name]
            cache[name] = make_tiny_llama(tmp_path_factory.mktemp(name), randomize_norms=True, **settings)
        return cache[name]

    return build


def _llm(path: Path, size: int, **engine: Any) -> Iterator[LLM]:
    llm = LLM(str(path), **(ENGINE | engine), tensor_parallel_size=size)
    try:
        yield llm
    finally:
        llm.llm_engine.close()


def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs]


# --- sharded loading (no processes) ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_each_rank_reads_exactly_its_shard(tp_model, name: str) -> None:
    path = tp_model(name)
    cfg, _ = load_model_config(path)
    cfg.max_model_len = 64
    full = dict(load_model(path, cfg, torch.float32, torch.device("cpu"), 64).named_parameters())
    file_bytes = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    for rank in range(2):
        model = load_model(path, cfg, torch.float32, torch.device("cpu"), 64, tp=TensorParallel(rank, 2))
        params = dict(model.named_parameters())
        held = sum(p.numel() * p.element_size() for p in params.values())
        assert model.load_stats.bytes_read == held < file_bytes * 0.75  # each rank reads its bytes, no more
        shards = model.load_stats.shards
        assert {"embed_tokens", "layers.0.self_attn.qkv_weight", "layers.1.mlp.down_weight"} <= set(shards)
        for pname, param in params.items():
            assert torch.equal(param, _expected_shard(full[pname], shards.get(pname))), pname


def _expected_shard(full: torch.Tensor, shard: ParamShard | None) -> torch.Tensor:
    if shard is None:
        return full
    return torch.cat([full.narrow(shard.dim, a, b - a) for a, b in shard.ranges], dim=shard.dim)


def test_a_row_parallel_bias_is_refused(tp_model) -> None:
    # o_proj and down_proj sum their ranks' partial outputs: a bias there would be added once per rank
    from torch import nn

    from folio.engine.distributed.sharding import shard_model
    from folio.engine.layers.weights import deferred_params
    from folio.engine.models.registry import model_class

    cfg, _ = load_model_config(tp_model("kv2-tied"))
    with deferred_params():
        model = model_class(cfg.architecture)(cfg, 64)
    attn = model.layers[0].self_attn
    attn.o_bias = nn.Parameter(torch.empty(attn.o_weight.shape[0], device="meta"), requires_grad=False)
    with pytest.raises(AssertionError, match=r"layers\.0\.self_attn\.o_weight is row-parallel and has a bias"):
        shard_model(model, TensorParallel(0, 2), torch.device("cpu"))


def test_tensor_parallelism_on_cuda_runs_eagerly() -> None:
    from folio.engine.llm_engine import eager_only

    tp2, tp1 = EngineConfig(model="m", tensor_parallel_size=2), EngineConfig(model="m")
    assert eager_only(tp2, torch.device("cuda")) and not eager_only(tp2, torch.device("cpu"))
    assert not eager_only(tp1, torch.device("cuda"))
    assert eager_only(EngineConfig(model="m", enforce_eager=True), torch.device("cuda"))


def test_partitions() -> None:
    assert [kv_heads(1, TensorParallel(r, 2)) for r in range(2)] == [(0, 1), (0, 1)]  # replicated
    assert [kv_heads(2, TensorParallel(r, 4)) for r in range(4)] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert [kv_heads(4, TensorParallel(r, 2)) for r in range(2)] == [(0, 2), (2, 4)]
    assert [vocab_rows(509, TensorParallel(r, 2)) for r in range(2)] == [(0, 255), (255, 509)]


def test_unshardable_models_are_refused_before_any_process_starts(tp_model) -> None:
    cfg, _ = load_model_config(tp_model("kv1-untied"))
    check_shardable(cfg, 2)
    check_shardable(cfg, 4)
    with pytest.raises(ValueError, match="num_attention_heads 4 is not divisible by it"):
        check_shardable(cfg, 3)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig(model="m", tensor_parallel_size=0)


# --- TP=2 against TP=1 and transformers (gloo, two processes) ---------------------------------------------


@pytest.mark.parametrize("name", list(MODELS))
def test_tp2_matches_tp1_and_transformers(tp_model, name: str) -> None:
    path = tp_model(name)
    prompts = random_prompts(500, (1, 9, 40))
    expected = hf_greedy(path, prompts, MAX_TOKENS)
    for tp1 in _llm(path, 1):
        assert _greedy(tp1, prompts) == expected
    for tp2 in _llm(path, 2):
        assert _greedy(tp2, prompts) == expected
        workers = tp2.llm_engine.parallel.worker_stats
        assert len(workers) == 1 and workers[0]["bytes_read"] < sum(p.stat().st_size for p in path.glob("*.safetensors"))


def test_tp2_prompt_logprobs_and_mean_logits_match_tp1(tp_model) -> None:
    """Prompt log-probabilities (and the parity gate's mean prompt logits) under TP=2, over prefill chunks
    and one-token chunks: every rank computes the same slices of prompt logits (their vocabulary-parallel
    gather is a collective), and the numbers are TP=1's."""
    path = tp_model("kv1-untied")
    prompts = random_prompts(500, (3, 40, 17))
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=3, mean_prompt_logits=True)
    results = []
    for size in (1, 2):
        for llm in _llm(path, size, max_num_batched_tokens=16):  # prompts split over chunks, down to one token
            results.append(llm.generate(prompts, params))
    for one, two in zip(*results, strict=True):
        assert two.outputs[0].token_ids == one.outputs[0].token_ids
        assert len(two.prompt_logprobs) == len(one.prompt_logprobs) == len(one.prompt_token_ids)
        for a, b in zip(one.prompt_logprobs[1:], two.prompt_logprobs[1:], strict=True):
            assert set(a) == set(b) and all(abs(a[t] - b[t]) < 1e-4 for t in a)
        torch.testing.assert_close(two.prompt_logits_mean, one.prompt_logits_mean, rtol=1e-4, atol=1e-4)


def test_tp2_constrained_answers_match_tp1(tp_model) -> None:
    """A grammar and a logit bias (applied by rank 0's sampler alone) beside a free request: the other rank
    takes the same path through each step (its mirrored sequences carry the parameters, not the grammar)."""
    from folio.engine.structured.params import StructuredOutputsParams

    path = tp_model("kv1-untied")
    prompts = random_prompts(500, (7, 12, 9), seed=5)
    params = [SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=StructuredOutputsParams(
                  json={"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99}},
                        "required": ["n"]})),
              SamplingParams(temperature=1.0, seed=2, max_tokens=6, logit_bias={7: 100.0}, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)]  # fmt: skip
    results = []
    for size in (1, 2):
        for llm in _llm(path, size):
            results.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
    assert results[0] == results[1]
    assert results[1][1] == [7] * 6


def test_tp2_prefix_caching_and_chunked_prefill(tp_model) -> None:
    """Cached prefix blocks are valid on every rank (each holds its heads of them), and chunked prefill
    steps mix prompts and decodes the same way on both ranks."""
    path = tp_model("kv1-untied")
    prefix = random_prompts(500, (48,), seed=3)[0]
    prompts = [prefix + tail for tail in random_prompts(500, (5, 11, 17), seed=4)]
    expected = hf_greedy(path, prompts, MAX_TOKENS)
    for tp2 in _llm(path, 2, max_num_batched_tokens=32, enable_prefix_caching=True):
        assert _greedy(tp2, prompts[:1]) == expected[:1]
        assert _greedy(tp2, prompts) == expected  # the later prompts reuse the first one's blocks
        stats = tp2.llm_engine.stats()
        assert stats.prefix_cache_hits_total >= 2 * 48 - 16


def test_tp2_sizes_every_rank_after_one_profiling_step(tp_model, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without kv_cache_memory_gib on a device with a meter (the GPU; here the process's resident set
    stands in), every rank starts with the profiling step's one-block cache, runs that step beside rank 0,
    then holds the size rank 0's profile gave: the same number of blocks everywhere."""
    from folio.engine import memory_profile
    from folio.engine.memory_profile import CpuMemory

    path = tp_model("kv2-tied")
    prompts = random_prompts(500, (1, 9, 40))
    expected = hf_greedy(path, prompts, MAX_TOKENS)
    # 300 MiB for the engine beyond what this process holds now, whatever earlier tests left resident: the
    # budget is utilization x total, so the total is scaled up by the utilization
    utilization = 0.9
    meter = CpuMemory(total=int((CpuMemory().in_use() + 300 * (1 << 20)) / utilization))
    monkeypatch.setattr(memory_profile, "meter_for", lambda device: meter)
    engine_args = {k: v for k, v in ENGINE.items() if k != "kv_cache_memory_gib"}
    llm = LLM(str(path), **engine_args, tensor_parallel_size=2, gpu_memory_utilization=utilization)
    try:
        engine = llm.llm_engine
        num_blocks = engine.block_manager.num_blocks
        assert num_blocks > memory_profile.PROFILE_KV_BLOCKS
        assert engine.runner.kv_caches[0][0].shape[0] == num_blocks
        assert [w["num_blocks"] for w in engine.parallel.worker_stats] == [num_blocks]
        assert _greedy(llm, prompts) == expected
    finally:
        llm.llm_engine.close()


# --- the step metadata rank 0 sends ------------------------------------------------------------------------


def test_step_mirror_rebuilds_the_batch_and_sends_only_new_blocks() -> None:
    from folio.engine.distributed.step_broadcast import StepEncoder, StepMirror
    from folio.engine.model_runner import prepare_inputs
    from folio.engine.scheduler import ScheduledSeq
    from folio.engine.sequence import Sequence

    params = SamplingParams(max_tokens=4)
    a = Sequence("a", None, list(range(10, 30)), params, 24, frozenset())
    b = Sequence("b", None, [7, 8, 9], params, 7, frozenset())
    a.block_table, b.block_table = [3, 4], [9]
    encoder, mirror = StepEncoder(), StepMirror()

    def roundtrip(batch: list[ScheduledSeq]) -> list:
        updates = encoder.encode(batch)
        mirrored = mirror.decode(updates)
        want, got = prepare_inputs(batch, 16, torch.device("cpu")), prepare_inputs(mirrored, 16, torch.device("cpu"))
        assert (got.input_ids, got.positions, got.slots, got.logit_rows) == (
            want.input_ids, want.positions, want.slots, want.logit_rows)  # fmt: skip
        assert [m.samples for m in mirrored] == [s.samples for s in batch]
        return updates

    first = roundtrip([ScheduledSeq(a, 16), ScheduledSeq(b, 3)])
    assert all(u.params is params for u in first)  # parameters go with a sequence's first step
    a.num_computed_tokens, b.num_computed_tokens = 16, 3
    b.token_ids.append(5)
    b.block_table.append(11)
    second = roundtrip([ScheduledSeq(a, 4), ScheduledSeq(b, 1)])
    assert [(u.table, u.table_from, u.params) for u in second] == [([], 2, None), ([11], 1, None)]  # only the new block
    b.block_table = [12]  # preempted and re-allocated: a new table goes whole
    b.num_computed_tokens = 0
    third = roundtrip([ScheduledSeq(b, 4)])
    assert (third[0].table, third[0].table_from) == ([12], 0)


def test_the_step_mirror_carries_a_verify_steps_proposals() -> None:
    from folio.engine.distributed.step_broadcast import StepEncoder, StepMirror
    from folio.engine.model_runner import prepare_inputs
    from folio.engine.scheduler import ScheduledSeq
    from folio.engine.sequence import Sequence

    a = Sequence("a", None, [4, 5, 6, 4, 5], SamplingParams(max_tokens=9), 24, frozenset())
    a.block_table, a.num_computed_tokens = [2], 4
    batch = [ScheduledSeq(a, 3, [6, 4])]  # its last token and two proposals after it
    [mirrored] = StepMirror().decode(StepEncoder().encode(batch))
    want, got = prepare_inputs(batch, 16, torch.device("cpu")), prepare_inputs([mirrored], 16, torch.device("cpu"))
    assert mirrored.draft == [6, 4] and mirrored.samples
    assert (got.input_ids, got.positions, got.slots, got.logit_rows) == (want.input_ids, want.positions, want.slots,
                                                                          want.logit_rows) == ([5, 6, 4], [4, 5, 6],
                                                                                               [36, 37, 38], [0, 1, 2])  # fmt: skip


@pytest.mark.parametrize("method", ["ngram", "draft model"])
def test_tp2_speculates_token_exact(tp_model, method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Verify steps over two ranks: the proposals reach the other rank with the step, every verify row's logits
    are gathered over the vocabulary's halves, and greedy answers are one process's without speculation (the
    draft model, when there is one, runs beside rank 0)."""
    from folio.engine.spec_decode.speculator import Speculator
    from tests.engine.test_spec_decode_engine import repetitive_prompts

    monkeypatch.setattr(Speculator, "step_budget", lambda self, n, lengths: sum(lengths))  # (rank 0 plans every step)
    path = tp_model("kv2-tied")
    config = ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
              if method == "ngram" else
              {"model": str(path), "num_speculative_tokens": 3})  # the target, whole, as its own draft: kept  # fmt: skip
    prompts = repetitive_prompts(500, seed=4)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    for tp1 in _llm(path, 1):
        expected = [o.outputs[0].token_ids for o in tp1.generate(prompts, params)]
    for tp2 in _llm(path, 2, speculative_config=config):
        assert [o.outputs[0].token_ids for o in tp2.generate(prompts, params)] == expected
        stats = tp2.llm_engine.stats().spec_decode
        assert stats is not None and stats.num_accepted_tokens > 0


@pytest.mark.parametrize("family", ["mixtral", "qwen3-moe", "gemma3", "phi3-longrope", "qwen2-window"])
def test_tp2_families_match_transformers(tp_model, family: str) -> None:
    """Experts sharded behind a replicated router (Mixtral, Qwen3-MoE with a dense layer), Gemma 3's scaled
    embeddings, sandwich norms and windows, Phi-3's fused tensors, Qwen2's q/k/v biases."""
    path = tp_model(family)
    prompts = random_prompts(512, (1, 9, 40))
    expected = hf_greedy(path, prompts, MAX_TOKENS)
    for tp2 in _llm(path, 2):
        assert _greedy(tp2, prompts) == expected


def test_tp2_gguf_loads_whole_and_slices(tmp_path: Path) -> None:
    """A GGUF file (Phi-3's fused attn_qkv and gate-up tensors) is dequantised whole on each rank, which
    keeps its slices: TP=2 answers as TP=1 does."""
    from tests.support.gguf_files import write_gguf

    folder = make_tiny_llama(tmp_path / "hf", arch="phi3", hidden_size=96, num_attention_heads=6,
                             num_key_value_heads=2, randomize_norms=True)  # fmt: skip
    gguf = write_gguf(folder, tmp_path / "phi3.gguf", "phi3")
    prompts = random_prompts(500, (1, 9, 40))
    for tp1 in _llm(gguf, 1, tokenizer=str(folder)):
        expected = _greedy(tp1, prompts)
    for tp2 in _llm(gguf, 2, tokenizer=str(folder)):
        assert _greedy(tp2, prompts) == expected
        assert tp2.llm_engine.runner.model.load_stats.shards["layers.0.self_attn.qkv_weight"].local_shape[0] == 3 * 16 + 2 * 16


def test_parallel_engines_one_after_another_in_one_process(tp_model) -> None:
    """An engine's ranks and process group go with it: collected (`del`), closed by a ``with`` block or by
    `shutdown` (twice is harmless), and the next parallel engine in the process starts and answers the same."""
    import torch.distributed as dist

    path = tp_model("kv2-tied")
    prompts = random_prompts(512, (5, 9))
    first = LLM(str(path), **ENGINE, tensor_parallel_size=2)
    want = _greedy(first, prompts)
    del first  # nothing else: the collected engine closes itself
    with LLM(str(path), **ENGINE, tensor_parallel_size=2) as second:
        assert _greedy(second, prompts) == want
    assert not dist.is_initialized()
    third = LLM(str(path), **ENGINE, tensor_parallel_size=2)
    assert _greedy(third, prompts) == want
    third.shutdown()
    third.shutdown()
    assert not dist.is_initialized() and not third.llm_engine.parallel.procs[0].is_alive()
