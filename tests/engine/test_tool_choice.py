"""The grammars of forced tool calls: ``"required"``'s schema accepts exactly the calls of the tools offered
(their ``$defs`` moved to the root, refs and all), one call without parallel_tool_calls; bad ``parameters``
are refused naming the field."""

from __future__ import annotations

import jsonschema
import pytest

from folio.engine.rules import RuleError
from folio.engine.tools.choice import EMPTY_PARAMETERS, check_parameters, required_schema

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "where": {"$ref": "#/$defs/place"}},
    "required": ["city"],
    "$defs": {"place": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}},
}
TIME = {  # the same $defs name for another definition, in draft 7's spelling
    "type": "object",
    "properties": {"at": {"$ref": "#/definitions/place"}},
    "required": ["at"],
    "definitions": {"place": {"type": "string", "pattern": "^[A-Z]{3}$"}},
}


def test_required_accepts_the_offered_calls_only() -> None:
    schema = required_schema({"get_weather": WEATHER, "get_time": TIME}, parallel=True)
    jsonschema.Draft202012Validator.check_schema(schema)
    ok = [
        {"name": "get_weather", "parameters": {"city": "Paris", "where": {"lat": 48.8}}},
        {"name": "get_time", "parameters": {"at": "CET"}},
    ]
    jsonschema.validate(ok, schema)
    for bad in (
        [],  # at least one call
        [{"name": "get_weather", "parameters": {"city": "Paris", "where": {"lat": "north"}}}],  # the ref holds
        [{"name": "get_time", "parameters": {"at": "cet"}}],  # the other tool's "place"
        [{"name": "launch", "parameters": {}}],
        [{"name": "get_time", "parameters": {"at": "CET"}, "extra": 1}],
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    assert WEATHER["$defs"] and TIME["definitions"]  # the tools' own schemas are left as they were


def test_without_parallel_calls_required_allows_one_call() -> None:
    schema = required_schema({"get_time": TIME}, parallel=False)
    jsonschema.validate([{"name": "get_time", "parameters": {"at": "UTC"}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_time", "parameters": {"at": "UTC"}}] * 2, schema)


def test_parameters_must_be_a_valid_schema_of_an_object() -> None:
    assert check_parameters(None, "p") == EMPTY_PARAMETERS
    assert check_parameters(WEATHER, "p") is WEATHER
    with pytest.raises(RuleError, match=r"tools\[1\]\.function\.parameters is not a valid JSON Schema") as bad:
        check_parameters({"type": "object", "properties": {"x": {"type": "strnig"}}}, "tools[1].function.parameters")
    assert bad.value.param == "tools[1].function.parameters"
    with pytest.raises(RuleError, match="must describe an object"):
        check_parameters({"type": "array"}, "p")
