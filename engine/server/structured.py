"""A request's constraints as the engine takes them: ``response_format`` (OpenAI's), ``structured_outputs``
(vLLM's current field) and ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar`` (vLLM's
older fields, which many clients still send) become one `StructuredOutputsParams`; ``logit_bias``'s string
keys become token ids. One code path for every spelling; at most one constraint per request."""

from __future__ import annotations

from typing import Any

from folio.engine.rules import RuleError
from folio.engine.sampling_params import check_logit_bias
from folio.engine.server import tool_calling
from folio.engine.server.protocol import ChatCompletionRequest, SamplingRequest
from folio.engine.structured.params import StructuredOutputsParams

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def constraint(req: SamplingRequest) -> StructuredOutputsParams | None:
    """The request's one constraint, or None; `RuleError` naming the field for one that cannot be. Worked
    out once per request (its checks walk schemas), then kept on it."""
    if req._constraint is None:
        req._constraint = (_constraint(req),)
    return req._constraint[0]


def _constraint(req: SamplingRequest) -> StructuredOutputsParams | None:
    found: list[StructuredOutputsParams] = []
    if isinstance(req, ChatCompletionRequest):  # a forced tool call's grammar
        forced = tool_calling.constraint(req)
        if forced is not None:
            found.append(forced)
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        found.append(StructuredOutputsParams(json_object=True, param="response_format"))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise RuleError("response_format of type json_schema needs json_schema.schema",
                            param="response_format.json_schema")  # fmt: skip
        found.append(StructuredOutputsParams(json=fmt.json_schema.schema_, param="response_format"))
    if req.structured_outputs is not None:
        so = req.structured_outputs
        found.append(StructuredOutputsParams(json=so.json_, regex=so.regex, grammar=so.grammar,
                                             choice=_choice(so.choice), json_object=bool(so.json_object)))  # fmt: skip
    for field, kind in _GUIDED.items():
        value: Any = getattr(req, field)
        if value is not None:
            found.append(StructuredOutputsParams(**{kind: _choice(value) if kind == "choice" else value}, param=field))
    if len(found) > 1:
        raise RuleError(f"{found[1].param}: a request takes one constraint; it also has {found[0].param}",
                        param=found[1].param)  # fmt: skip
    return found[0] if found else None


def logit_bias(req: SamplingRequest) -> dict[int, float] | None:
    if not req.logit_bias:
        return None
    bias = {}
    for key, value in req.logit_bias.items():
        if not key.strip().isdigit():
            raise RuleError(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias")
        bias[int(key)] = value
    return check_logit_bias(bias)


def _choice(values: list[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)
