"""Tiny random Llama-family models for engine tests, each built once per session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.models import make_tiny_llama

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

# name -> make_tiny_llama arguments: GQA ratios 1, 2 and 3, tied/untied, llama3 rope, Qwen2 bias, Mistral
VARIANTS: dict[str, dict[str, Any]] = {
    "llama-gqa2": {},
    "llama-mha": {"num_attention_heads": 4, "num_key_value_heads": 4},
    "llama-gqa3-tied": {"num_attention_heads": 6, "num_key_value_heads": 2, "hidden_size": 96, "tie_word_embeddings": True},
    "llama-gqa4": {"num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 128},
    "llama3-rope": {"rope_scaling": LLAMA3_ROPE},
    "qwen2-bias": {"arch": "qwen2", "num_attention_heads": 6, "num_key_value_heads": 2, "hidden_size": 96},
    "mistral": {"arch": "mistral", "tie_word_embeddings": True},
}


def _randomise_biases(folder: Path, seed: int = 0) -> None:
    """`transformers` initialises biases to zero, which would hide a missing bias; make them random."""
    import torch
    from safetensors.torch import load_file, save_file

    torch.manual_seed(seed)
    for file in folder.glob("*.safetensors"):
        tensors = load_file(file)
        for name, t in tensors.items():
            if name.endswith(".bias"):
                tensors[name] = torch.randn_like(t) * 0.5
        save_file(tensors, file, metadata={"format": "pt"})


@pytest.fixture(scope="session")
def tiny_variant(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in cache:
            path = make_tiny_llama(tmp_path_factory.mktemp(name), **VARIANTS[name])
            if VARIANTS[name].get("arch") == "qwen2":
                _randomise_biases(path)
            cache[name] = path
        return cache[name]

    return build


@pytest.fixture(scope="package", autouse=True)
def _one_torch_thread():
    """Engine tests run single-threaded: on a shared, busy machine OpenMP's thread barriers turn small
    ops into waits far longer than the work (results do not depend on the thread count)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
