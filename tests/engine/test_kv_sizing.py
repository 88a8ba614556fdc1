"""KV cache sizing: the activation reserve covers the largest step the scheduler can run, which without
chunked prefill is a whole max_model_len prompt (it assumed 2048 tokens whatever the setting)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from folio.engine.config import EngineConfig
from folio.engine.llm_engine import LLMEngine, step_token_budget

# Llama-3-8B's shapes: only these fields enter the reserve
LLAMA3_8B = SimpleNamespace(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, head_dim=128,
                            vocab_size=128256, max_model_len=32768)


def reserve(**settings: object) -> int:
    config = EngineConfig(model="unused", **settings)  # type: ignore[arg-type]
    engine = SimpleNamespace(config=config, dtype=torch.bfloat16)
    return LLMEngine._activation_reserve(engine, LLAMA3_8B)  # type: ignore[arg-type]


def test_the_step_budget_is_a_whole_prompt_without_chunked_prefill() -> None:
    assert step_token_budget(EngineConfig(model="unused", enable_chunked_prefill=False), LLAMA3_8B) == 32768
    assert step_token_budget(EngineConfig(model="unused"), LLAMA3_8B) == 2048
    assert step_token_budget(EngineConfig(model="unused", max_num_batched_tokens=8192), LLAMA3_8B) == 8192


def test_the_reserve_covers_a_max_model_len_prefill_with_chunking_off() -> None:
    chunked, whole = reserve(), reserve(enable_chunked_prefill=False)
    # a bf16 step of Llama-3-8B holds at least its hidden states, MLP activations and q/k/v per token, twice
    # over (input and output of each op): the 30720 tokens more than a chunked step must be covered
    per_token = (4 * 4096 + 3 * 14336 + 3 * 32 * 128) * 2
    assert whole - chunked >= 2 * (32768 - 2048) * per_token
