"""Continuous batching never changes results: the same greedy tokens alone or in a batch of 32 mixed
lengths, with prefix caching on or off, chunked prefill on or off, and under forced preemption."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from folio.engine import LLM, SamplingParams
from folio.engine.model_runner import kv_bytes_per_block

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
GIB = 1 << 30


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(3, 512, (40,), generator=g).tolist()  # a common "system prompt"
    lengths = torch.randint(1, 300, (32,), generator=g).tolist()
    out = [torch.randint(3, 512, (n,), generator=g).tolist() for n in lengths]
    return [shared + p if i % 2 else p for i, p in enumerate(out)]


@pytest.fixture(scope="module")
def alone(tiny_llama: Path, prompts: list[list[int]]) -> list[list[int]]:
    llm = LLM(str(tiny_llama), enable_prefix_caching=False)
    return [llm.generate([p], GREEDY)[0].outputs[0].token_ids for p in prompts]


def _kv_gib_for_blocks(model: Path, num_blocks: int) -> float:
    llm = LLM(str(model), kv_cache_memory_gib=0.001)
    per_block = kv_bytes_per_block(llm.llm_engine.model_config, 16, torch.float32)
    return num_blocks * per_block / GIB


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"enable_prefix_caching": False},
        {"max_num_batched_tokens": 64},  # long prompts prefill over several steps
        {"max_num_batched_tokens": 64, "enable_chunked_prefill": False},
        {"max_num_seqs": 5},
    ],
    ids=["default", "no-prefix-cache", "chunked-64", "unchunked", "max-5-seqs"],
)
def test_batch_matches_alone(tiny_llama: Path, prompts, alone, kwargs) -> None:
    llm = LLM(str(tiny_llama), **kwargs)
    outs = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == alone
    stats = llm.llm_engine.stats()
    assert stats.num_running == stats.num_waiting == 0
    assert stats.kv_cache_usage == 0.0  # every block returned (cached ones count as free)
    if kwargs.get("enable_prefix_caching", True):
        assert stats.prefix_cache_hits_total > 0  # the shared prefix was reused


def test_preemption_recomputes_to_the_same_output(tiny_llama: Path, prompts, alone) -> None:
    # 40 blocks hold 640 tokens: the longest request fits alone, the batch does not
    llm = LLM(str(tiny_llama), kv_cache_memory_gib=_kv_gib_for_blocks(tiny_llama, 40))
    assert llm.llm_engine.block_manager.num_blocks == 40
    outs = llm.generate(prompts, GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == alone
    stats = llm.llm_engine.stats()
    assert stats.num_preemptions_total > 0
    assert stats.kv_cache_usage == 0.0


def test_prefix_cache_hits_on_repeat(tiny_llama: Path, prompts, alone) -> None:
    llm = LLM(str(tiny_llama))
    first = llm.generate(prompts[:8], GREEDY)
    before = llm.llm_engine.stats()
    second = llm.generate(prompts[:8], GREEDY)
    after = llm.llm_engine.stats()
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in second] == alone[:8]
    queried = after.prefix_cache_queries_total - before.prefix_cache_queries_total
    hits = after.prefix_cache_hits_total - before.prefix_cache_hits_total
    # every full block but the one holding each prompt's last token comes from the cache
    expected = sum((len(p) - 1) // 16 * 16 for p in prompts[:8])
    assert (queried, hits) == (sum(len(p) for p in prompts[:8]), expected)
