"""The new families from GGUF files (written as llama.cpp would), against `transformers` reading the same
file: Qwen3, Phi-3 (fused tensors kept fused), Gemma 3 (norms stored as 1 + weight) and Qwen3-MoE
(experts stacked per layer). Mixtral has no GGUF form that `transformers` reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from folio.engine import LLM, SamplingParams
from tests.engine.test_hf_equivalence import random_prompts
from tests.support.gguf_files import write_gguf
from tests.support.models import make_tiny_llama

# `transformers` takes some settings from its config classes' defaults rather than the GGUF metadata
# (Qwen3's head_dim 128; Qwen3-MoE's 128 experts, top-8, width 768), so the tiny configs use those
GGUF_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": ("qwen3", {"arch": "qwen3", "head_dim": 128}),
    "phi3": ("phi3", {"arch": "phi3", "hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 2}),
    "gemma3": ("gemma3", {"arch": "gemma3_text", "num_hidden_layers": 2, "head_dim": 32, "sliding_window": 24,
                          "num_key_value_heads": 1, "tie_word_embeddings": True}),
    "qwen3-moe": ("qwen3moe", {"arch": "qwen3_moe", "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                               "moe_intermediate_size": 768, "num_hidden_layers": 1}),
}


@pytest.mark.parametrize("family", list(GGUF_FAMILIES))
def test_gguf_family_matches_transformers(tmp_path: Path, family: str) -> None:
    gguf_arch, config = GGUF_FAMILIES[family]
    folder = make_tiny_llama(tmp_path / "hf", randomize_norms=True, **config)
    gguf = write_gguf(folder, tmp_path / f"{family}.gguf", gguf_arch)
    prompts = random_prompts(512, (1, 9, 60))
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=gguf.name, dtype=torch.float32).eval()
    expected = []
    with torch.inference_mode():
        for p in prompts:
            ids = hf.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False)
            expected.append(ids[0, len(p) :].tolist())
    llm = LLM(str(gguf), dtype="float32", tokenizer=str(folder))
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=12))
    assert [o.outputs[0].token_ids for o in outs] == expected
