"""Gemma 3 270M, the second real model: greedy outputs equal `transformers`' on the same weights, from
the safetensors folder and from the GGUF file, with a prompt longer than its 512-token sliding window."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from folio.engine import LLM, SamplingParams
from tests.engine.test_hf_equivalence import hf_greedy

PROMPTS = [
    "The Eiffel Tower is located in the city of",
    "def fibonacci(n):",
    "Écris un haïku sur la mer 🌊:",
    # about 700 tokens: the local layers see only the last 512 of them
    "Here is a list of rivers: " + ", ".join(["the Rhine, the Danube, the Loire, the Seine"] * 60) + ". The longest",
]

# the prompts' token ids and transformers' greedy continuations of them
Reference = tuple[list[list[int]], list[list[int]]]


@pytest.fixture(scope="module")
def expected(gemma3_dir: Path) -> Reference:
    """The prompts' token ids and transformers' greedy continuations, computed once for both checks."""
    tok = AutoTokenizer.from_pretrained(gemma3_dir)
    prompts = [tok(p).input_ids for p in PROMPTS]
    assert len(prompts[-1]) > 512
    return prompts, hf_greedy(gemma3_dir, prompts, 16)


def _check(model: str, reference: Reference, **engine: object) -> None:
    prompts, expected = reference
    llm = LLM(model, dtype="float32", max_model_len=1024, **engine)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16))
    for prompt, want, out in zip(prompts, expected, outs, strict=True):
        assert out.prompt_token_ids == prompt
        assert out.outputs[0].token_ids == want, f"prompt of {len(prompt)} tokens"
    assert "Paris" in outs[0].outputs[0].text


def test_gemma3_270m_matches_transformers(gemma3_dir: Path, expected: Reference) -> None:
    _check(str(gemma3_dir), expected)


def test_gemma3_270m_gguf_matches_transformers(gemma3_gguf_path: Path, gemma3_dir: Path, expected: Reference) -> None:
    # gemma3_dir holds the same GGUF as transformers dequantised it; the engine reads the file itself
    # (its own renaming and norm conversion), with the tokenizer of the folder (the GGUF's takes ~20 s)
    _check(str(gemma3_gguf_path), expected, tokenizer=str(gemma3_dir))
