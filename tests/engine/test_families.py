"""Every model family token-exact against `transformers` `generate` (greedy, CPU, float32), on tiny random
configs that exercise each family's quirks: sliding windows shorter than the prompts, GQA ratios other
than the defaults, explicit head_dim, untied heads, per-layer-type rope, LongRoPE, top-2 (and top-3) of
8 experts, dense layers between sparse ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from folio.engine import LLM, SamplingParams
from tests.engine.test_hf_equivalence import hf_greedy, random_prompts
from tests.support.models import make_tiny_llama

PROMPT_LENGTHS = (1, 7, 40, 150)
MAX_TOKENS = 24
ORIGINAL_CONTEXT = 64  # the tiny Phi-3's trained context, below max_position_embeddings: LongRoPE's switch


def _longrope(head_dim: int, partial: float = 1.0) -> dict[str, Any]:
    n = int(head_dim * partial) // 2
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.05 * i for i in range(n)],
        "long_factor": [1.0 + 0.5 * i for i in range(n)],
        "original_max_position_embeddings": ORIGINAL_CONTEXT,
        "partial_rotary_factor": partial,
    }


FAMILIES: dict[str, dict[str, Any]] = {
    # every layer windowed, the window (20) shorter than two of the prompts and not a block multiple
    "mistral-window": {"arch": "mistral", "sliding_window": 20},
    # Qwen2: full attention below max_window_layers, windowed above
    "qwen2-window": {"arch": "qwen2", "use_sliding_window": True, "sliding_window": 24, "max_window_layers": 1},
    # Qwen3: q/k norm, head_dim 32 != hidden / heads, GQA 4:1, untied head
    "qwen3": {"arch": "qwen3", "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32},
    # Gemma 3: two local layers then a global one, window 24, GQA 4:1, head_dim 32, its own attention scale,
    # linear-scaled rope on global layers only, tied embeddings
    "gemma3": {
        "arch": "gemma3_text", "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 32, "query_pre_attn_scalar": 24, "sliding_window": 24, "tie_word_embeddings": True,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    },
    # Phi-3: fused qkv/gate_up tensors, LongRoPE with a partial rotary factor, a window, GQA 3:1
    "phi3-longrope": {
        "arch": "phi3", "hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 2,
        "sliding_window": 48, "rope_parameters": {**_longrope(16, 0.5), "rope_theta": 10_000.0},
    },
    # Mixtral: top-2 of 8 experts, renormalized
    "mixtral": {"arch": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 96},
    # Qwen3-MoE: top-2 of 8 renormalized, a dense layer (mlp_only_layers) after the sparse one
    "qwen3-moe": {
        "arch": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
        "norm_topk_prob": True, "mlp_only_layers": [1], "head_dim": 32,
    },
    # top-3 without renormalization: three outputs summed, in the reference's order
    "qwen3-moe-top3": {
        "arch": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 3, "moe_intermediate_size": 48,
        "norm_topk_prob": False,
    },
}


@pytest.fixture(scope="session")
def family_model(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in cache:
            cache[name] = make_tiny_llama(tmp_path_factory.mktemp(name), randomize_norms=True, **FAMILIES[name])
        return cache[name]

    return build


def _check(path: Path, prompts: list[list[int]], max_model_len: int | None = None, **engine: Any) -> None:
    expected = hf_greedy(path, prompts, MAX_TOKENS)
    llm = LLM(str(path), dtype="float32", max_model_len=max_model_len, **engine)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS))
    for prompt, want, out in zip(prompts, expected, outs, strict=True):
        assert out.outputs[0].token_ids == want, f"prompt of {len(prompt)} tokens"


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "phi3-longrope"])
def test_family_matches_transformers(family_model, family: str) -> None:
    _check(family_model(family), random_prompts(512, PROMPT_LENGTHS))


def test_phi3_longrope_short_and_long_factors(family_model) -> None:
    path = family_model("phi3-longrope")
    # within the trained context the short factors apply: an engine whose max_model_len stays inside it
    short = [p for p in random_prompts(512, PROMPT_LENGTHS) if len(p) + MAX_TOKENS <= ORIGINAL_CONTEXT]
    _check(path, short, max_model_len=ORIGINAL_CONTEXT)
    # beyond it the long factors (and LongRoPE's attention scaling) apply from the first token on
    _check(path, random_prompts(512, (ORIGINAL_CONTEXT + 1, 150), seed=1))


@pytest.mark.parametrize("family", ["gemma3", "mistral-window"])
def test_windows_with_chunked_prefill_and_prefix_cache(family_model, family: str) -> None:
    """Chunks of 16 tokens and prompts sharing a cached 48-token prefix read the window across block and
    chunk boundaries; the outputs stay those of `transformers`."""
    path = family_model(family)
    shared = random_prompts(512, (48,), seed=2)[0]
    prompts = [shared + tail for tail in random_prompts(512, (5, 30, 1), seed=3)] + random_prompts(512, (70,))
    _check(path, prompts, max_num_batched_tokens=16, enable_prefix_caching=True)


@pytest.mark.parametrize("family", ["mixtral", "qwen3-moe"])
def test_moe_reports_active_parameters(family_model, family: str) -> None:
    llm = LLM(str(family_model(family)), dtype="float32")
    total, active = llm.llm_engine.runner.model.parameter_counts()
    hf_total = sum(p.numel() for p in _hf_model(family_model(family)).parameters())
    assert total == hf_total
    assert active < total


def _hf_model(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


@pytest.mark.parametrize("family", ["gemma3", "mistral-window"])
def test_windows_on_every_attention_path(family_model, family: str) -> None:
    """The CPU path's native decode kernel, its gather + SDPA fallback, the `folio.kernels` path (what CUDA
    runs; its reference twins on CPU tensors) and decode graphs over its static buffers (the CPU stand-in
    for CUDA graphs) give the same tokens, with windows shorter than the contexts."""
    from folio.engine.cuda_graphs import EagerStepGraph

    prompts = random_prompts(512, (3, 30, 70, 130), seed=4)
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    llm = LLM(str(family_model(family)), dtype="float32", block_size=8, max_num_batched_tokens=48)
    runner = llm.llm_engine.runner

    def tokens() -> list[list[int]]:
        return [o.outputs[0].token_ids for o in llm.generate(prompts, greedy)]

    expected = tokens()
    runner.native_decode = not runner.native_decode
    assert tokens() == expected
    runner.use_kernels = True
    runner.model.use_kernels(True)
    assert tokens() == expected
    runner.enable_decode_graphs(graph_factory=EagerStepGraph, max_batch_size=4)
    assert tokens() == expected


def test_unsupported_architecture_fails_at_load_listing_the_supported(tmp_path: Path) -> None:
    import json

    from folio.engine.models.registry import SUPPORTED_ARCHITECTURES

    path = make_tiny_llama(tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["GPTNeoXForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="GPTNeoXForCausalLM") as err:
        LLM(str(path))
    for name in ("Qwen3ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM", "MixtralForCausalLM",
                 "Qwen3MoeForCausalLM", "LlamaForCausalLM"):
        assert name in SUPPORTED_ARCHITECTURES and name in str(err.value)
