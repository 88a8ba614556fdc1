"""Tool calling through `folio serve` on a real engine, with the official `openai` client: a tiny random
Qwen 2 with Qwen 2.5's own tool template, served with --enable-auto-tool-choice and no parser named (the
family's default, hermes). Forced calls ("required", a named function) always parse and validate against
their function's schema, sampled at temperature 1.0 as well as greedy, streamed or whole; "auto" reads a
hermes call out of the answer, and a malformed one stays content."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from tests.server.conftest import Serve, start_serve, stop_serve
from tests.server.test_tools_api import streamed_calls
from tests.support.models import make_tiny_llama

TEMPLATE = Path(__file__).parents[1] / "support" / "templates" / "qwen2_5_tools.jinja"

BOOKING = {  # nested objects, arrays with bounds, enums, anyOf, $ref/$defs, patterns, formats, number bounds
    "type": "object",
    "properties": {
        "guest": {"$ref": "#/$defs/person"},
        "nights": {"type": "integer", "minimum": 1, "maximum": 14},
        "room": {"enum": ["single", "double", "suite"]},
        "extras": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3},
        "budget": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 900}, {"type": "null"}]},
        "arrival": {"type": "string", "format": "date"},
        "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{3}$"},
        "note": {"type": "string", "maxLength": 12},
    },
    "required": ["guest", "nights", "room", "extras", "arrival", "code"],
    "additionalProperties": False,
    "$defs": {
        "person": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 18}},
            "required": ["name"],
            "additionalProperties": False,
        }
    },
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "pattern": "^[A-Z]{3}$"}}, "required": ["zone"]}
TOOLS: Any = [
    {"type": "function", "function": {"name": "book_room", "description": "Book a hotel room.", "parameters": BOOKING}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"book_room": BOOKING, "get_time": TIME}
ASK: Any = [{"role": "user", "content": "Book me a room."}]


@pytest.fixture(scope="module")
def qwen_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import AutoTokenizer

    model = make_tiny_llama(tmp_path_factory.mktemp("qwen") / "m", arch="qwen2", max_position_embeddings=4096)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = TEMPLATE.read_text()
    tokenizer.save_pretrained(model)
    return model


@pytest.fixture(scope="module")
def qwen(folio_bin: str, qwen_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    model = qwen_model
    serve = start_serve(folio_bin, model, tmp_path_factory.mktemp("serve"), "--enable-auto-tool-choice",
                        "--max-num-seqs", "8", "--max-model-len", "2048")  # fmt: skip
    yield serve
    stop_serve(serve)


def check(calls: list[tuple[str, str]]) -> None:
    assert calls
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name], format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "book_room"}}])
def test_forced_calls_always_parse_and_validate(qwen: Serve, tool_choice: Any) -> None:
    client = qwen.client()
    for temperature, seed in ((0.0, None), (1.0, 1), (1.0, 2), (1.0, 3)):
        answer = client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=tool_choice,
                                                temperature=temperature, seed=seed, max_tokens=400)  # fmt: skip
        choice = answer.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        check([(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []])
        print([(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []])
    chunks = list(client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice=tool_choice,
                                                 temperature=1.0, seed=4, max_tokens=400, stream=True))  # fmt: skip
    content, calls, finish = streamed_calls(chunks)
    assert (content, finish) == ("", "tool_calls")
    check([(c["name"], c["arguments"]) for c in calls.values()])


def test_without_parallel_tool_calls_required_makes_one_call(qwen: Serve) -> None:
    for seed in range(3):
        answer = qwen.client().chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
            temperature=1.0, seed=seed, max_tokens=400,
        )  # fmt: skip
        assert len(answer.choices[0].message.tool_calls or []) == 1


def test_auto_reads_the_models_hermes_call_and_the_template_renders_the_tools(qwen: Serve, qwen_model: Path) -> None:
    # a random model calls no tool of its own accord: a regex (vLLM's extension, which applies beside tools)
    # makes it write a hermes block as Qwen does, with a zone of its own choosing
    forced = r'<tool_call>\n\{"name": "get_time", "arguments": \{"zone": "[A-Z]{3}"\}\}\n</tool_call>'
    answer = httpx.post(f"{qwen.url}/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": ASK, "tools": TOOLS, "structured_outputs": {"regex": forced}, "temperature": 1.0,
        "seed": 5, "max_tokens": 100, "return_token_ids": True,
    }).json()  # fmt: skip
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    check([(call["function"]["name"], call["function"]["arguments"])])
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(qwen_model).decode(answer["prompt_token_ids"])
    assert "<tools>\n" + json.dumps(TOOLS[0]) in prompt  # Qwen's system turn lists the tools


def test_auto_gives_a_call_to_an_unknown_function_back_as_content(qwen: Serve) -> None:
    forced = r'Sure\. <tool_call>\n\{"name": "launch", "arguments": \{\}\}\n</tool_call>'
    answer = qwen.client().chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, temperature=0, max_tokens=100,
        extra_body={"structured_outputs": {"regex": forced}},
    )  # fmt: skip
    choice = answer.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert choice.message.content == 'Sure. <tool_call>\n{"name": "launch", "arguments": {}}\n</tool_call>'
