"""KV cache sizing from a profiling step (`folio.engine.memory_profile`), tested on the CPU through the
same accounting the GPU uses: the process's resident memory stands in for the device's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from folio.engine import memory_profile
from folio.engine.config import EngineConfig
from folio.engine.llm import LLM
from folio.engine.llm_engine import step_token_budget
from folio.engine.memory_profile import CpuMemory
from folio.engine.sampling_params import SamplingParams
from tests.support.models import make_tiny_llama

MAX_LEN = 4096
MIB = 1 << 20


def test_the_step_budget_is_a_whole_prompt_without_chunked_prefill(tmp_path: Path) -> None:
    cfg = type("Cfg", (), {"max_model_len": 32768})()
    assert step_token_budget(EngineConfig(model="unused", enable_chunked_prefill=False), cfg) == 32768
    assert step_token_budget(EngineConfig(model="unused"), cfg) == 2048
    assert step_token_budget(EngineConfig(model="unused", max_num_batched_tokens=8192), cfg) == 8192


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # wide enough that a 4k-token step's activations (tens of MiB) stand out of the resident set's noise
    return make_tiny_llama(tmp_path_factory.mktemp("wide"), hidden_size=256, intermediate_size=2048,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
                           max_position_embeddings=MAX_LEN)


def pretend_device(monkeypatch: pytest.MonkeyPatch, headroom: int) -> CpuMemory:
    """A 'device' measured as the GPU would be, whose default utilization (0.9) leaves the engine ``headroom``
    beyond the process's current resident set, however much earlier tests left resident."""
    meter = CpuMemory(total=int((CpuMemory().in_use() + headroom) / EngineConfig(model="unused").gpu_memory_utilization))
    monkeypatch.setattr(memory_profile, "meter_for", lambda device: meter)
    return meter


def test_a_max_model_len_prefill_without_chunking_stays_within_the_budget(
    wide_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meter = pretend_device(monkeypatch, 600 * MIB)
    llm = LLM(str(wide_model), device="cpu", max_model_len=MAX_LEN, enable_chunked_prefill=False,
              gpu_memory_utilization=0.9, max_num_seqs=256)
    engine = llm.llm_engine
    cache_bytes = sum(k.numel() * k.element_size() * 2 for k, _ in engine.runner.kv_caches)
    assert engine.block_manager.num_blocks > 2 * -(-MAX_LEN // engine.config.block_size)  # the budget binds
    limit = 0.9 * meter.total()
    # the cache took what the profile left: weights and cache (resident now) leave the activations' room
    assert cache_bytes > 100 * MIB and meter.in_use() < limit

    meter.reset_peak()
    prompt = [(7 * i) % 4096 for i in range(MAX_LEN - 1)]  # the longest prompt, one step (chunking off)
    out = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
    assert len(out[0].outputs[0].token_ids) == 1
    # a few MiB of slack for the interpreter's own allocations between the profile and now
    peak = meter.peak()
    assert peak <= limit + 8 * MIB, f"peak {peak / MIB:.1f} MiB over the limit {limit / MIB:.1f} MiB"


def test_profiling_leaves_sampling_as_it_was(wide_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = SamplingParams(max_tokens=8, temperature=1.0, top_k=20)
    fixed = LLM(str(wide_model), device="cpu", max_model_len=512, kv_cache_memory_gib=0.05, seed=3)
    expected = [o.outputs[0].token_ids for o in fixed.generate(["ab", "cd"], params)]
    pretend_device(monkeypatch, 400 * MIB)
    profiled = LLM(str(wide_model), device="cpu", max_model_len=512, seed=3)
    assert profiled.llm_engine.block_manager.num_blocks != fixed.llm_engine.block_manager.num_blocks
    assert [o.outputs[0].token_ids for o in profiled.generate(["ab", "cd"], params)] == expected


def test_a_budget_the_weights_and_activations_exhaust_is_refused(
    wide_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a budget of half what this process holds already (free heap memory that earlier tests left resident
    # can serve the engine's weights without the resident set growing, so a budget near it might fit a block)
    pretend_device(monkeypatch, -CpuMemory().in_use() // 2)
    with pytest.raises(ValueError, match="does not hold one block"):
        LLM(str(wide_model), device="cpu", max_model_len=MAX_LEN, enable_chunked_prefill=False)


def test_the_profile_batch_is_the_largest_step() -> None:
    batch = memory_profile.profile_batch(2048, 3, vocab_size=100, block_size=16)
    assert [item.num_tokens for item in batch] == [683, 683, 682]
    assert all(item.samples and len(item.seq.block_table) * 16 >= item.num_tokens for item in batch)
    assert all(0 <= t < 100 for item in batch for t in item.seq.token_ids)


def test_the_profile_runs_a_prompt_logprobs_step_too() -> None:
    # a request's prompt log-probabilities turn [rows, vocabulary] slices of logits beside the step's own
    # activations: the profile runs the longest prompt that way as well
    steps: list[list] = []
    runner = SimpleNamespace(cfg=SimpleNamespace(max_model_len=512, vocab_size=100), block_size=16,
                             sampler=SimpleNamespace(generator=torch.Generator()))
    memory_profile.profile_step(runner, CpuMemory(), 1024, 4, run_step=steps.append)  # type: ignore[arg-type]
    shapes = [(len(batch), batch[0].num_tokens, batch[0].seq.prompt_logits is not None) for batch in steps]
    assert shapes == [(1, 511, False), (1, 511, True), (4, 256, False)]


def test_what_the_decode_graphs_hold_is_measured_from_an_empty_cache() -> None:
    # on CUDA the engine captures its graphs once against the profiling cache and keeps what they hold
    # (their pool, cuBLAS's workspaces) out of the KV cache's budget
    class Meter:
        used, resets = 1000, 0

        def reset_peak(self) -> None:  # as CudaMemory's: synchronizes and empties the allocator's cache
            self.resets += 1
            self.used = self.used // 10 * 10  # what the cache held is gone

        def in_use(self) -> int:
            return self.used

    meter = Meter()
    meter.used += 7  # cached blocks the profile step left

    def capture() -> None:
        meter.used += 300 + 5  # the graphs' pool, and blocks cached during capture

    assert memory_profile.held_by(meter, capture) == 300 and meter.resets == 2  # type: ignore[arg-type]


def test_the_cuda_meter_is_used_only_on_cuda() -> None:
    assert memory_profile.meter_for(torch.device("cpu")) is None
