"""Load the Hugging Face tokenizer of a model folder or a GGUF file."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(model: str | Path, tokenizer: str | Path | None = None) -> Any:
    from transformers import AutoTokenizer

    if tokenizer is not None:
        return AutoTokenizer.from_pretrained(str(tokenizer))
    p = Path(model)
    if p.is_file() and p.suffix == ".gguf":
        from folio.engine.gguf_reader import in_transformers

        with in_transformers():
            return AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    return AutoTokenizer.from_pretrained(str(p))
