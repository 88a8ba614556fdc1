"""A request's tools and ``tool_choice``, checked, and the grammar that constrains a forced call: the
function's ``parameters`` schema for a named function; for ``"required"``, an array of one or more calls
(at most one without ``parallel_tool_calls``), each ``{"name": one of the tools, "parameters": its
schema}`` (vLLM's form), so the arguments always parse and validate."""

from __future__ import annotations

import copy
import json
import re
from functools import lru_cache
from typing import Any

from folio.engine.rules import RuleError

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


def check_parameters(parameters: dict[str, Any] | None, param: str) -> dict[str, Any]:
    """A function's ``parameters``: a JSON Schema (2020-12) of an object; none means no arguments."""
    if parameters is None:
        return EMPTY_PARAMETERS
    error = _schema_error(json.dumps(parameters, sort_keys=True))
    if error:
        raise RuleError(f"{param} is not a valid JSON Schema: {error}", param=param)
    kind = parameters.get("type")
    if kind is not None and kind != "object":
        raise RuleError(f"{param} must describe an object (type: object), got type {kind!r}", param=param)
    return parameters


@lru_cache(maxsize=1024)
def _schema_error(schema_text: str) -> str | None:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(json.loads(schema_text))
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"{exc.message}" + (f" (at {where})" if where else "")
    return None


def required_schema(tools: dict[str, dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """The schema of ``tool_choice: "required"``'s answer. Each tool's ``$defs`` (and draft 7's
    ``definitions``) move to the root under a name of the tool's own, and its ``$ref``s with them: refs are
    resolved from the root, and two tools may use one name for different definitions."""
    defs: dict[str, Any] = {}
    calls = []
    for i, (name, parameters) in enumerate(tools.items()):
        parameters = _hoist(parameters, f"t{i}_", defs)
        calls.append({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [name]}, "parameters": parameters},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        })  # fmt: skip
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls} if len(calls) > 1 else calls[0]}
    if not parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _hoist(schema: dict[str, Any], prefix: str, defs: dict[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(schema)
    renamed: dict[str, str] = {}
    for key in ("$defs", "definitions"):
        for def_name, definition in (schema.pop(key, None) or {}).items():
            renamed[f"#/{key}/{def_name}"] = f"#/$defs/{prefix}{def_name}"
            defs[f"{prefix}{def_name}"] = definition

    def rewrite(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (_ref(v) if k == "$ref" and isinstance(v, str) else rewrite(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [rewrite(v) for v in node]
        return node

    def _ref(ref: str) -> str:
        for old, new in renamed.items():
            if ref == old or ref.startswith(old + "/"):
                return new + ref[len(old) :]
        return ref

    for def_name in [n for n in defs if n.startswith(prefix)]:
        defs[def_name] = rewrite(defs[def_name])
    return rewrite(schema)
