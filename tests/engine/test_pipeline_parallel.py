"""Pipeline parallelism on the CPU with gloo: PP=2, PP=4 and PP=2 × TP=2 token-exact against one process
and `transformers` (a dense and a mixture-of-experts family), micro-batches in flight, several nodes
over loopback (a headless `folio serve` beside rank 0), and the start-up and planning errors."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from folio.engine import LLM, SamplingParams
from folio.engine.config import ConfigValueError, EngineConfig, ModelConfig
from folio.engine.distributed.pipeline import Layout, check_pipelinable, stage_layers
from folio.engine.loader import load_model_config
from tests.engine.test_families import FAMILIES
from tests.engine.test_hf_equivalence import hf_greedy, random_prompts
from tests.support.models import make_tiny_llama
from tests.support.ports import master_port

MAX_TOKENS = 8
ENGINE = {"dtype": "float32", "max_model_len": 256, "kv_cache_memory_gib": 0.02}
MODELS: dict[str, dict[str, Any]] = {
    # four layers (two stages of two, four of one), a vocabulary the TP ranks split unevenly, untied head
    "dense": {"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 509, "num_hidden_layers": 4},
    # experts routed on every stage; a dense layer (mlp_only_layers) on the first
    "moe": FAMILIES["qwen3-moe"] | {"num_hidden_layers": 4},
    "tied": {"num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True, "num_hidden_layers": 4},
}


@pytest.fixture(scope="module")
def pp_model(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in cache:
            cache[name] = make_tiny_llama(tmp_path_factory.mktemp(name), randomize_norms=True, **MODELS[name])
        return cache[name]

    return build


def _llm(path: Path, **engine: Any) -> Iterator[LLM]:
    with LLM(str(path), **(ENGINE | engine)) as llm:
        yield llm


def _greedy(llm: LLM, prompts: list[list[int]], max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs]


# --- the layout (no processes) ----------------------------------------------------------------------------


def _config(layers: int, vocab: int = 512, hidden: int = 64, intermediate: int = 128) -> ModelConfig:
    return ModelConfig("LlamaForCausalLM", vocab, hidden, intermediate, layers, 4, 2, hidden // 4, 1e-6, 1024, False)


@settings(max_examples=60, deadline=None)
@given(layers=st.integers(1, 96), stages=st.integers(1, 16), vocab=st.sampled_from([512, 32000, 262144]))
def test_stages_cover_the_layers_in_order(layers: int, stages: int, vocab: int) -> None:
    stages = min(stages, layers)
    cfg = _config(layers, vocab=vocab)
    parts = [stage_layers(cfg, stages, s) for s in range(stages)]
    assert [i for part in parts for i in part] == list(range(layers)), "contiguous, in order, each layer once"
    assert all(len(part) >= 1 for part in parts)
    later = [len(p) for p in parts[1:]]
    assert not later or max(later) - min(later) <= 1, "the stages after the first share the rest evenly"


def test_the_first_stage_gets_fewer_layers_for_the_head() -> None:
    """SmolLM2's shape: its 49k x 576 head weighs about 8 of its 30 layers, so stage 0 runs 11 and stage 1 19;
    a small vocabulary splits evenly."""
    smollm2 = _config(30, vocab=49152, hidden=576, intermediate=1536)
    smollm2.num_attention_heads, smollm2.num_key_value_heads, smollm2.head_dim = 9, 3, 64
    assert [len(stage_layers(smollm2, 2, s)) for s in range(2)] == [11, 19]
    assert [len(stage_layers(_config(8, vocab=64), 2, s)) for s in range(2)] == [4, 4]


def test_layout_places_tensor_groups_inside_stages() -> None:
    layout = Layout(tp_size=2, pp_size=3)
    assert [layout.stage(r) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [layout.tp_rank(r) for r in range(6)] == [0, 1, 0, 1, 0, 1]
    assert layout.stage_ranks(2) == [4, 5]


def test_more_stages_than_layers_are_refused_naming_the_numbers(pp_model) -> None:
    cfg, _ = load_model_config(pp_model("dense"))
    with pytest.raises(ValueError, match=r"pipeline_parallel_size 5 .* 4 decoder layers"):
        check_pipelinable(cfg, 5)
    start = time.monotonic()
    with pytest.raises(ValueError, match="pipeline_parallel_size 5"):
        LLM(str(pp_model("dense")), **ENGINE, pipeline_parallel_size=5)
    assert time.monotonic() - start < 30, "refused before any process starts"


@pytest.mark.parametrize(("settings_", "field"), [
    ({"pipeline_parallel_size": 0}, "pipeline_parallel_size"),
    ({"pipeline_parallel_size": 2, "speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
     "speculative_config"),
    ({"pipeline_parallel_size": 2, "enable_lora": True}, "enable_lora"),
    ({"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "nnodes": 3}, "nnodes"),
    ({"tensor_parallel_size": 2, "pipeline_parallel_size": 1, "nnodes": 2}, "nnodes"),  # a TP group split
    ({"pipeline_parallel_size": 2, "nnodes": 2, "node_rank": 2}, "node_rank"),
    ({"master_port": 65535}, "master_port"),
    ({"rendezvous_timeout": 0}, "rendezvous_timeout"),
])  # fmt: skip
def test_bad_parallel_settings_name_their_field(settings_: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigValueError) as info:
        EngineConfig(model="m", **settings_)
    assert info.value.field == field


# --- PP against one process (gloo, processes on this machine) ----------------------------------------------


@pytest.mark.parametrize(("name", "tp", "pp"), [("dense", 1, 2), ("dense", 1, 4), ("dense", 2, 2), ("moe", 1, 2),
                                                ("tied", 1, 2)])  # fmt: skip
def test_pipeline_matches_one_process_and_transformers(pp_model, name: str, tp: int, pp: int) -> None:
    path = pp_model(name)
    prompts = random_prompts(500, (1, 9, 40, 23, 5))
    expected = hf_greedy(path, prompts, MAX_TOKENS)
    for llm in _llm(path, tensor_parallel_size=tp, pipeline_parallel_size=pp):
        assert _greedy(llm, prompts) == expected
        parallel = llm.llm_engine.parallel
        assert parallel.layers == stage_layers(llm.llm_engine.model_config, pp, 0)
        assert len(llm.llm_engine.runner.model.layers) == len(parallel.layers) < 4
        assert [w["num_blocks"] for w in parallel.worker_stats] == [llm.llm_engine.block_manager.num_blocks] * (tp * pp - 1)


def test_micro_batches_are_in_flight_together_and_abort_waits_for_theirs(pp_model) -> None:
    """Two stages keep two micro-batches in flight, each a share of the sequences, none in both; a request
    aborted while its micro-batch is in a stage finishes once it is back, and the others carry on exact."""
    path = pp_model("dense")
    prompts = random_prompts(500, (3, 7, 11, 5, 9, 13), seed=9)
    for one in _llm(path):
        expected = _greedy(one, prompts, 12)
    with LLM(str(path), **ENGINE, pipeline_parallel_size=2) as llm:
        engine = llm.llm_engine
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, params)
        depths: list[int] = []  # micro-batches begun and not sampled, as each is sampled
        finish = engine._finish_step

        def counted(handle: Any) -> Any:
            assert engine._in_flight is not None
            depths.append(len(engine._in_flight) + 1)
            return finish(handle)

        engine._finish_step = counted  # type: ignore[method-assign]
        tokens: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
        aborted = False
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens[out.request_id] += out.outputs[0].token_ids  # (each output: the new tokens)
            assert engine._in_flight is not None
            in_flight = [item.seq for batch, _ in engine._in_flight for item in batch]
            assert len(in_flight) == len({id(s) for s in in_flight}), "a sequence in one micro-batch at a time"
            if not aborted and in_flight:
                victim = in_flight[0].request_id
                engine.abort_request(victim)
                aborted = True
                assert id(in_flight[0]) in engine._aborted_in_flight
        assert max(depths) == 2
        assert not engine._aborted_in_flight and engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        for i, want in enumerate(expected):
            if str(i) != victim:
                assert tokens[str(i)] == want
        assert len(tokens[victim]) < 12


def test_pipeline_prompt_logprobs_and_mean_logits_match_one_process(pp_model) -> None:
    """What the parity gate reads (prompt log-probabilities, mean prompt logits) over prefill chunks down
    to one token: the last stage sends every row back when prompt logits are wanted."""
    path = pp_model("dense")
    prompts = random_prompts(500, (3, 40, 17))
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, prompt_logprobs=3, mean_prompt_logits=True)
    results = []
    for pp in (1, 2):
        for llm in _llm(path, pipeline_parallel_size=pp, max_num_batched_tokens=16):
            results.append(llm.generate(prompts, params))
    for one, two in zip(*results, strict=True):
        assert two.outputs[0].token_ids == one.outputs[0].token_ids
        for a, b in zip(one.prompt_logprobs[1:], two.prompt_logprobs[1:], strict=True):
            assert set(a) == set(b) and all(abs(a[t] - b[t]) < 1e-4 for t in a)
        torch.testing.assert_close(two.prompt_logits_mean, one.prompt_logits_mean, rtol=1e-4, atol=1e-4)


def test_sampled_and_constrained_requests_match_one_process(pp_model) -> None:
    """Rank 0 samples (seeds, grammars and biases stay where the sequences live)."""
    from folio.engine.structured.params import StructuredOutputsParams

    path = pp_model("dense")
    prompts = random_prompts(500, (7, 12, 9), seed=5)
    params = [SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=StructuredOutputsParams(
                  json={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})),
              SamplingParams(temperature=1.0, seed=2, max_tokens=6, ignore_eos=True),
              SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=6, ignore_eos=True)]  # fmt: skip
    results = []
    for pp in (1, 2):
        for llm in _llm(path, pipeline_parallel_size=pp):
            results.append([o.outputs[0].token_ids for o in llm.generate(prompts, params)])
    assert results[0] == results[1]


# --- several nodes (a headless `folio serve` on loopback) -----------------------------------------------------


def _headless(path: Path, port: int, *flags: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([
        sys.executable, "-m", "folio.operator.cli", "serve", "--model", str(path), "--dtype", "float32",
        "--max-model-len", "256", "--kv-cache-memory-gib", "0.02", "--master-port", str(port), *flags,
    ], env=None if env is None else {**os.environ, **env})  # fmt: skip


@pytest.mark.parametrize(("tp", "pp"), [(1, 2), (2, 2)])
def test_two_nodes_over_loopback_match_one_process(pp_model, tp: int, pp: int) -> None:
    """Node 1 (`folio serve --headless`, its rank from LWS_WORKER_INDEX as a LeaderWorkerSet pod gets it) runs
    the second half of the ranks; rank 0 reaches them through the TCP store and its step channel. When
    rank 0 shuts down, the node exits 0."""
    path = pp_model("dense")
    prompts = random_prompts(500, (1, 9, 40))
    for one in _llm(path):
        expected = _greedy(one, prompts)
    port = master_port()
    node1 = _headless(path, port, "--tensor-parallel-size", str(tp), "--pipeline-parallel-size", str(pp), "--nnodes",
                      "2", "--headless", env={"LWS_WORKER_INDEX": "1", "LWS_LEADER_ADDRESS": "127.0.0.1",
                                              "LWS_GROUP_SIZE": "2"})  # fmt: skip
    try:
        for llm in _llm(path, tensor_parallel_size=tp, pipeline_parallel_size=pp, nnodes=2, master_port=port):
            assert _greedy(llm, prompts) == expected
            assert list(llm.llm_engine.parallel.remote) == list(range(tp * pp // 2, tp * pp))
        assert node1.wait(60) == 0
    finally:
        node1.kill()
        node1.wait()


def test_a_node_that_never_arrives_fails_the_group_naming_its_ranks(pp_model) -> None:
    path = pp_model("dense")
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"ranks \[1\] of 2 did not arrive within 3s"):
        LLM(str(path), **ENGINE, pipeline_parallel_size=2, nnodes=2, master_port=master_port(), rendezvous_timeout=3)
    assert time.monotonic() - start < 60


def test_a_headless_node_without_rank_0_exits_with_the_reason(pp_model, capfd: pytest.CaptureFixture[str]) -> None:
    node1 = _headless(pp_model("dense"), master_port(), "--pipeline-parallel-size", "2", "--nnodes", "2",
                      "--node-rank", "1", "--headless", "--rendezvous-timeout", "2")  # fmt: skip
    try:
        assert node1.wait(120) == 1
    finally:
        node1.kill()
    assert "rank 1 could not reach rank 0 at 127.0.0.1" in capfd.readouterr().err


def test_a_dead_stage_takes_the_engine_down(pp_model) -> None:
    """A stage's process killed mid-serving: the watchdog fails the group and the next step says which rank."""
    from folio.engine.llm_engine import EngineBrokenError

    path = pp_model("dense")
    for llm in _llm(path, pipeline_parallel_size=2):
        engine = llm.llm_engine
        assert _greedy(llm, random_prompts(500, (5,))) != []
        engine.parallel.procs[0].kill()
        deadline = time.monotonic() + 30
        while engine.parallel.failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "rank 1" in str(engine.parallel.failure) and "exited" in str(engine.parallel.failure)
        engine.add_request("late", random_prompts(500, (5,))[0], SamplingParams(max_tokens=2))
        with pytest.raises(EngineBrokenError, match="rank 1"):
            while engine.has_unfinished_requests():
                engine.step()


def test_a_stage_that_hangs_is_caught_by_the_watchdog(pp_model) -> None:
    """A stage stopped mid-serving (SIGSTOP): rank 0's receive of the step's rows waits past the collective
    timeout, the watchdog names it and kills the ranks, and the step raises instead of hanging."""
    import signal

    from folio.engine.llm_engine import EngineBrokenError

    for llm in _llm(pp_model("dense"), pipeline_parallel_size=2, collective_timeout=2.0):
        engine = llm.llm_engine
        assert _greedy(llm, random_prompts(500, (5,))) != []
        worker = engine.parallel.procs[0]
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            engine.add_request("stuck", random_prompts(500, (5,))[0], SamplingParams(max_tokens=4))
            start = time.monotonic()
            with pytest.raises(EngineBrokenError, match=r"recv on rank 0 has waited .* \(collective timeout 2s\)"):
                while engine.has_unfinished_requests():
                    engine.step()
            assert time.monotonic() - start < 30
        finally:
            if worker.is_alive():
                os.kill(worker.pid, signal.SIGKILL)
