"""The model families the engine serves, by `transformers` architecture name, model_type and GGUF
architecture. A new family is its file in this package plus one entry in `FAMILIES`."""

from __future__ import annotations

from folio.engine.models.base import DecoderLM
from folio.engine.models.gemma3 import Gemma3ForCausalLM
from folio.engine.models.llama import LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
from folio.engine.models.mixtral import MixtralForCausalLM
from folio.engine.models.phi3 import Phi3ForCausalLM
from folio.engine.models.qwen3 import Qwen3ForCausalLM
from folio.engine.models.qwen3_moe import Qwen3MoeForCausalLM

FAMILIES: tuple[type[DecoderLM], ...] = (
    LlamaForCausalLM,
    MistralForCausalLM,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
    Gemma3ForCausalLM,
    Phi3ForCausalLM,
    MixtralForCausalLM,
    Qwen3MoeForCausalLM,
)

SUPPORTED_ARCHITECTURES = tuple(a for cls in FAMILIES for a in cls.ARCHITECTURES)
_BY_ARCHITECTURE = {a: cls for cls in FAMILIES for a in cls.ARCHITECTURES}
_BY_MODEL_TYPE = {t: cls for cls in FAMILIES for t in cls.MODEL_TYPES}
_BY_GGUF = {g: cls for cls in FAMILIES for g in cls.GGUF_ARCHITECTURES}
SUPPORTED_GGUF_ARCHITECTURES = tuple(_BY_GGUF)


def model_class(architecture: str) -> type[DecoderLM]:
    cls = _BY_ARCHITECTURE.get(architecture)
    if cls is None:
        raise ValueError(
            f"architecture {architecture!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return cls


def architecture_of(hf_config: dict) -> str:
    """The architecture a config.json (or a config derived from GGUF metadata) names; refuses unsupported
    ones with the list of supported architectures."""
    names = hf_config.get("architectures") or []
    if names:
        model_class(names[0])
        return names[0]
    model_type = hf_config.get("model_type")
    cls = _BY_MODEL_TYPE.get(model_type or "")
    if cls is None:
        raise ValueError(
            f"model_type {model_type!r} is not supported (supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return cls.ARCHITECTURES[0]


def gguf_family(gguf_architecture: str) -> type[DecoderLM]:
    cls = _BY_GGUF.get(gguf_architecture)
    if cls is None:
        raise ValueError(
            f"GGUF architecture {gguf_architecture!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)})"
        )
    return cls

