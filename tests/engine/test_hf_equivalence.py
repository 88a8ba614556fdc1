"""Greedy outputs are token-identical to `transformers` `generate` (CPU, float32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from folio.engine import LLM, SamplingParams
from tests.engine.conftest import VARIANTS

PROMPT_LENGTHS = (1, 7, 40, 150)


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = model.generate(torch.tensor([p]), max_new_tokens=max_new_tokens, do_sample=False)
            outs.append(ids[0, len(p) :].tolist())
    return outs


def random_prompts(vocab: int, lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_tiny_models_match_transformers(tiny_variant, variant: str) -> None:
    path = tiny_variant(variant)
    prompts = random_prompts(512, PROMPT_LENGTHS)
    expected = hf_greedy(path, prompts, 24)
    llm = LLM(str(path), dtype="float32")
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24))
    for prompt, want, out in zip(prompts, expected, outs, strict=True):
        assert out.prompt_token_ids == prompt
        assert out.outputs[0].token_ids == want, f"{variant}, prompt of {len(prompt)} tokens"
        # generate stops at EOS exactly where the engine does
        assert out.outputs[0].finish_reason == ("stop" if len(want) < 24 else "length")


SMOL_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Écris un haïku sur la mer 🌊:"]


def _check_smollm2(model: str, reference_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(reference_dir)
    prompts = [tok(p).input_ids for p in SMOL_PROMPTS]
    expected = hf_greedy(reference_dir, prompts, 20)
    llm = LLM(model, dtype="float32", max_model_len=512)
    outs = llm.generate(SMOL_PROMPTS, SamplingParams(temperature=0.0, max_tokens=20))
    for prompt, want, out in zip(prompts, expected, outs, strict=True):
        assert out.prompt_token_ids == prompt
        assert out.outputs[0].token_ids == want
        # the engine holds back a trailing partial UTF-8 character; decode() shows it as U+FFFD
        assert out.outputs[0].text == tok.decode(want, skip_special_tokens=True).rstrip("\ufffd")


def test_smollm2_safetensors_matches_transformers(smollm2_dir: Path) -> None:
    _check_smollm2(str(smollm2_dir), smollm2_dir)


def test_smollm2_gguf_matches_transformers(smollm2_gguf_path: Path, smollm2_dir: Path) -> None:
    # smollm2_dir is the same GGUF converted by transformers: same weights, HF's own dequantisation
    _check_smollm2(str(smollm2_gguf_path), smollm2_dir)


def test_chunked_prompts_whose_steps_sample_nothing_match_transformers(tiny_variant) -> None:
    """With prompts in a step the last layer runs its output projection and feed-forward block for the
    sampled rows only; a chunk that is not its prompt's last samples nothing, so the step passes none."""
    path = tiny_variant("llama-gqa2")
    prompts = random_prompts(512, (150, 3, 61), seed=4)
    expected = hf_greedy(path, prompts, 8)
    llm = LLM(str(path), dtype="float32", max_num_batched_tokens=16)
    model = llm.llm_engine.runner.model
    rows_seen: list[int | None] = []
    real = model.forward
    model.forward = lambda *a, **k: rows_seen.append(None if a[4] is None else len(a[4])) or real(*a, **k)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8))
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert 0 in rows_seen  # a step of prompt chunks only
    assert None in rows_seen  # decode-only steps keep every row
