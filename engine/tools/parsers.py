"""The tool-call parsers by name (``--tool-call-parser``, vLLM's names) and each model family's default."""

from __future__ import annotations

from folio.engine.tools.hermes import HermesParser
from folio.engine.tools.llama3_json import Llama3JsonParser
from folio.engine.tools.mistral import MistralParser
from folio.engine.tools.parser import ToolParser
from folio.engine.tools.pythonic import PythonicParser

PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser, PythonicParser)
}

# a Hugging Face model_type -> the format its instruct models call tools in
FAMILY_DEFAULTS = {
    "qwen2": "hermes",
    "qwen2_moe": "hermes",
    "qwen3": "hermes",
    "qwen3_moe": "hermes",
    "llama": "llama3_json",
    "mistral": "mistral",
    "mixtral": "mistral",
}


def parser_for(name: str | None, model_type: str | None) -> ToolParser:
    """The parser ``name`` names, else ``model_type``'s default; ValueError naming the choices if neither."""
    if name is None:
        name = FAMILY_DEFAULTS.get(model_type or "")
        if name is None:
            raise ValueError(f"no default tool-call parser for model family {model_type!r}; "
                             f"pass --tool-call-parser ({', '.join(PARSERS)})")  # fmt: skip
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {', '.join(PARSERS)}")
    return PARSERS[name]()
