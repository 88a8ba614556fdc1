"""What a request constrains its answer to (vLLM's `StructuredOutputsParams`): exactly one of a JSON schema,
any JSON object, a regex, a list of choices or an EBNF grammar."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from folio.engine.rules import RuleError

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON schema (as text or as an object)
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None  # EBNF (GBNF, as llama.cpp writes it)
    param: str = "structured_outputs"  # the request field it came from, for the 400s

    def __post_init__(self) -> None:
        given = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(given) != 1:
            raise RuleError(f"{self.param} must set exactly one of {', '.join(KINDS)}; got "
                            f"{', '.join(given) or 'none'}", param=self.param)  # fmt: skip
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise RuleError(f"{self.param}: choice must be a non-empty list of non-empty strings",
                                param=self.param)  # fmt: skip
            object.__setattr__(self, "choice", tuple(self.choice))
        if isinstance(self.json, str):
            try:
                json.loads(self.json)
            except ValueError as exc:
                raise RuleError(f"{self.param}: the JSON schema is not valid JSON: {exc}", param=self.param) from None

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))

    def schema_text(self) -> str | None:
        """The schema as compact JSON text (the compile cache's key), or None for the other kinds. Keys keep
        their order: an answer's properties come in the schema's order."""
        if self.json is None:
            return None
        schema = json.loads(self.json) if isinstance(self.json, str) else self.json
        return json.dumps(schema, separators=(",", ":"))

    def key(self) -> tuple[str, str]:
        """Equal for requests that compile to the same grammar."""
        kind = self.kind
        if kind == "json":
            return kind, self.schema_text() or ""
        if kind == "choice":
            return kind, json.dumps(self.choice)
        return kind, str(getattr(self, kind))
