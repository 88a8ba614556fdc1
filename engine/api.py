"""Folio's paged-attention inference engine: `from folio.engine import LLM, SamplingParams`.

This is `folio.engine`'s package module: setup.py installs it as `folio/engine/__init__.py` (engine/ has
no `__init__.py` of its own, so that nothing at the repo root is importable as a bare `engine`). Public
names are imported lazily so that `folio --help` and the digest function do not pay for importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from folio.engine.config import EngineConfig
    from folio.engine.llm import LLM
    from folio.engine.llm_engine import LLMEngine
    from folio.engine.lora import LoRAError, LoRARequest
    from folio.engine.outputs import CompletionOutput, RequestOutput
    from folio.engine.sampling_params import SamplingParams

__all__ = [
    "LLM", "CompletionOutput", "EngineConfig", "LLMEngine", "LoRAError", "LoRARequest", "RequestOutput",
    "SamplingParams",
]

_LAZY = {
    "LLM": "folio.engine.llm",
    "LLMEngine": "folio.engine.llm_engine",
    "EngineConfig": "folio.engine.config",
    "SamplingParams": "folio.engine.sampling_params",
    "RequestOutput": "folio.engine.outputs",
    "CompletionOutput": "folio.engine.outputs",
    "LoRARequest": "folio.engine.lora",
    "LoRAError": "folio.engine.lora",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'folio.engine' has no attribute {name!r}")
