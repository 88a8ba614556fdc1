"""Structured output through `folio serve` with the official `openai` client: response_format (json_object,
json_schema, and the SDK's `parse` with a pydantic model), vLLM's structured_outputs and its older guided_*
fields, logit_bias, on both endpoints, streamed and whole; bad constraints are 400s naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.server.conftest import Serve, start_serve, stop_serve

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 10},
        "population": {"type": "integer", "minimum": 0, "maximum": 10_000_000},
        "districts": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3},
    },
    "required": ["city", "population", "districts"],
    "additionalProperties": False,
}
CHAT = [{"role": "user", "content": "Describe a city as JSON."}]


class Pet(BaseModel):
    name: str = Field(max_length=8)
    kind: Literal["cat", "dog"]
    age: int = Field(ge=0, le=30)


@pytest.fixture(scope="module")
def tiny(folio_bin: str, tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    serve = start_serve(folio_bin, tiny_llama, tmp_path_factory.mktemp("serve"), "--max-num-seqs", "8")
    yield serve
    stop_serve(serve)


def test_chat_json_schema_greedy_sampled_and_streamed(tiny: Serve) -> None:
    client = tiny.client()
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    for temperature, seed in ((0.0, None), (1.0, 1), (1.0, 2)):
        answer = client.chat.completions.create(model="m", messages=CHAT, response_format=fmt, max_tokens=200,
                                                temperature=temperature, seed=seed)  # fmt: skip
        assert answer.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(answer.choices[0].message.content or ""), SCHEMA)
    chunks = client.chat.completions.create(model="m", messages=CHAT, response_format=fmt, max_tokens=200,
                                            temperature=1.0, seed=3, stream=True)  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_the_sdks_parse_returns_a_parsed_pydantic_object(tiny: Serve) -> None:
    answer = tiny.client().chat.completions.parse(model="m", messages=CHAT, response_format=Pet, max_tokens=100,
                                                  temperature=1.0, seed=4)  # fmt: skip
    pet = answer.choices[0].message.parsed
    assert isinstance(pet, Pet) and pet.kind in ("cat", "dog") and 0 <= pet.age <= 30


def test_completions_take_every_spelling_of_a_constraint(tiny: Serve) -> None:
    client = tiny.client()
    cases: list[tuple[dict[str, Any], Any]] = [
        ({"structured_outputs": {"choice": ["red", "green"]}}, lambda t: t in ("red", "green")),
        ({"guided_choice": ["up", "down"]}, lambda t: t in ("up", "down")),
        ({"structured_outputs": {"regex": r"[0-9]{3}-[a-z]{2}"}}, lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2}", t)),
        ({"guided_regex": r"x[0-9]+y"}, lambda t: re.fullmatch(r"x[0-9]+y", t)),
        ({"guided_json": SCHEMA}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
        ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
        ({"guided_grammar": 'root ::= "a" ("b" | "c")+'}, lambda t: re.fullmatch(r"a[bc]+", t)),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}},
         lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
    ]  # fmt: skip
    for body, fits in cases:
        answer = client.completions.create(model="m", prompt="Answer:", max_tokens=200, temperature=1.0, seed=5,
                                           extra_body=body)  # fmt: skip
        text = answer.choices[0].text
        assert answer.choices[0].finish_reason == "stop" and fits(text), (body, text)


def test_logit_bias_bans_a_token(tiny: Serve) -> None:
    client = tiny.client()
    free = client.completions.create(model="m", prompt="Answer:", max_tokens=6, temperature=0.0,
                                     extra_body={"return_token_ids": True})  # fmt: skip
    banned = set(free.choices[0].model_extra["token_ids"])  # type: ignore[index]
    again = client.completions.create(model="m", prompt="Answer:", max_tokens=6, temperature=0.0,
                                      logit_bias={str(t): -100 for t in banned}, extra_body={"return_token_ids": True})
    assert not banned & set(again.choices[0].model_extra["token_ids"])  # type: ignore[index]


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
         "response_format", "cannot be compiled"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
         "response_format.json_schema", "needs json_schema.schema"),
        ({"guided_regex": "(ab"}, "guided_regex", "cannot be compiled"),
        ({"structured_outputs": {"grammar": 'root ::= "a" ('}}, "structured_outputs", "cannot be compiled"),
        ({"structured_outputs": {}}, "structured_outputs", "exactly one of"),
        ({"guided_choice": ["a"], "guided_regex": "a"}, "guided_choice", "takes one constraint"),
        ({"response_format": {"type": "json_object"}, "guided_json": SCHEMA}, "guided_json", "takes one constraint"),
        ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
        ({"logit_bias": {"abc": 1}}, "logit_bias", "token ids"),
        ({"logit_bias": {"1": 200}}, "logit_bias", "from -100 to 100"),
        ({"logit_bias": {"99999": 1}}, "logit_bias", "not in the vocabulary"),
    ],
)  # fmt: skip
def test_bad_constraints_are_400s_naming_the_field(tiny: Serve, body: dict[str, Any], param: str, words: str) -> None:
    for path, extra in (("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions", {"messages": CHAT})):
        reply = httpx.post(f"{tiny.url}{path}", json={"model": "m", "max_tokens": 4, **extra, **body}, timeout=30)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == param and words in error["message"], error


def test_a_bad_request_leaves_the_server_serving(tiny: Serve) -> None:
    with pytest.raises(openai.BadRequestError):
        tiny.client().completions.create(model="m", prompt="x", max_tokens=4, extra_body={"guided_regex": "("})
    assert tiny.client().completions.create(model="m", prompt="x", max_tokens=2).choices[0].text is not None


def test_the_llguidance_backend_serves_the_same_api(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> None:
    serve = start_serve(folio_bin, tiny_llama, tmp_path, "--structured-outputs-backend", "llguidance")
    try:
        client = serve.client()
        fmt: Any = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
        answer = client.chat.completions.create(model="m", messages=CHAT, response_format=fmt, max_tokens=200,
                                                temperature=1.0, seed=1)  # fmt: skip
        jsonschema.validate(json.loads(answer.choices[0].message.content or ""), SCHEMA)
        text = client.completions.create(model="m", prompt="x", max_tokens=40, temperature=1.0, seed=2,
                                         extra_body={"guided_regex": r"[0-9]{3}-[a-z]{2}"}).choices[0].text
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", text), text
        reply = httpx.post(f"{serve.url}/v1/completions", json={"model": "m", "prompt": "x", "guided_regex": "(ab"})
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "guided_regex"
    finally:
        stop_serve(serve)
