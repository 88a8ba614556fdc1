"""Tool calling through the API, with the official `openai` client against the app on a fake engine whose
answers are scripted: calls read out of free text ("auto", the hermes parser), forced calls ("required", a
named function) streamed name first and then arguments in fragments, tool turns through the chat
template, a continuation that resumes inside a call, and the 400s of bad tools."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from folio.engine.server.continuation import CREATED_HEADER, RESPONSE_ID_HEADER, RESUME_FIELD
from tests.server.conftest import MODEL, serving_fake
from tests.server.fake_engine import OFFSET, FakeEngine
from tests.server.test_continuation import RESUMABLE, by_choice, events, resume_field, without_id

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS: Any = [WEATHER, TIME]
ASK: Any = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
GREEDY: Any = {"temperature": 0, "max_tokens": 200}


def served(script: str, **config: Any):
    return serving_fake(FakeEngine(script=script, max_model_len=1024), **config)


def streamed_calls(chunks: list[Any]) -> tuple[str, dict[int, dict[str, Any]], str | None]:
    """Content, calls (index -> id, name, arguments) and finish reason, put together from a stream."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            if d.index not in calls:  # a call's first delta names it
                assert d.id and d.type == "function" and d.function.name, d
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:
                assert d.id is None and d.function.name is None, d
            calls[d.index]["arguments"] += d.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, calls, finish


def test_auto_reads_calls_out_of_free_text_whole_and_streamed() -> None:
    with served("Let me check. " + CALL, tool_call_parser="hermes") as s:
        client = s.client()
        whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, **GREEDY).choices[0]
        assert whole.finish_reason == "tool_calls" and whole.message.content == "Let me check."
        [call] = whole.message.tool_calls or []
        assert (call.type, call.function.name, json.loads(call.function.arguments)) == ("function", "get_weather", {"city": "Paris"})
        assert call.id.startswith("call_")
        chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, stream=True, **GREEDY))
        content, calls, finish = streamed_calls(chunks)
        assert (content, finish) == ("Let me check.", "tool_calls")
        assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [("get_weather", {"city": "Paris"})]


def test_auto_without_a_call_is_plain_content_and_a_cut_call_is_content_too() -> None:
    with served("Sunny, 21 degrees <b>.", tool_call_parser="hermes") as s:
        whole = s.client().chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, **GREEDY).choices[0]
        assert (whole.message.content, whole.message.tool_calls, whole.finish_reason) == ("Sunny, 21 degrees <b>.", None, "stop")
    with served("Hm. " + CALL, tool_call_parser="hermes") as s:  # max_tokens ends the answer inside the block
        client = s.client()
        cut: Any = {**GREEDY, "max_tokens": 30}
        whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, **cut).choices[0]
        assert (whole.message.content, whole.message.tool_calls, whole.finish_reason) == (("Hm. " + CALL)[:30], None, "length")
        chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, stream=True, **cut))
        assert streamed_calls(chunks) == (("Hm. " + CALL)[:30], {}, "length")


def test_required_streams_the_name_first_then_the_arguments_in_fragments() -> None:
    script = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}, {"name": "get_time", "parameters": {}}]'
    with served(script) as s:  # the fake engine follows no grammar: the script is what the grammar would allow
        client = s.client()
        whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", **GREEDY)
        message = whole.choices[0].message
        assert message.content is None and whole.choices[0].finish_reason == "tool_calls"
        assert [(c.function.name, c.function.arguments) for c in message.tool_calls or []] == [
            ("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")]  # fmt: skip
        chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                                     stream=True, **GREEDY))  # fmt: skip
        content, calls, finish = streamed_calls(chunks)
        assert (content, finish) == ("", "tool_calls")
        assert [(c["name"], c["arguments"]) for c in calls.values()] == [("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")]
        fragments = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or [] if d.index == 0]
        assert len(fragments) > 3  # one token per step: the arguments come as they are written


def test_a_named_function_is_called_with_the_answer_as_its_arguments() -> None:
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    with served('{"city": "Lima"}') as s:
        client = s.client()
        whole = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=named, **GREEDY)
        [call] = whole.choices[0].message.tool_calls or []
        assert (call.function.name, call.function.arguments, whole.choices[0].finish_reason) == ("get_weather", '{"city": "Lima"}', "tool_calls")
        chunks = list(client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=named,
                                                     stream=True, **GREEDY))  # fmt: skip
        assert streamed_calls(chunks)[1][0]["arguments"] == '{"city": "Lima"}'


def test_tools_and_tool_turns_reach_the_chat_template() -> None:
    conversation: Any = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]  # fmt: skip
    with served("It is sunny.", tool_call_parser="hermes") as s:
        answer = s.http().post("/v1/chat/completions", json={
            "model": MODEL, "messages": conversation, "tools": TOOLS, "tool_choice": "none", "return_token_ids": True,
            **GREEDY}).json()  # fmt: skip
    prompt = bytes(t - OFFSET for t in answer["prompt_token_ids"] if t >= OFFSET).decode()
    assert f"<tools>{json.dumps(TOOLS)}" in prompt  # as the request had them
    assert '<call>{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt  # arguments as an object
    assert "<answers call_1>sunny" in prompt
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "It is sunny."}  # "none": content


def test_a_stream_cut_inside_a_call_continues_it_seamlessly() -> None:
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, "stream": True, **GREEDY}
    with served("Checking. " + CALL + " Done.", tool_call_parser="hermes") as s, s.http() as http:
        full = http.post("/v1/chat/completions", json=body, headers=RESUMABLE)
        answer_id, created = full.headers[RESPONSE_ID_HEADER], int(full.headers[CREATED_HEADER])
        got = events(full.text)
        want = [without_id(c) for c in by_choice([d for _, d in got if d is not None])[0]]
        assert any(c["choices"][0]["delta"].get("tool_calls") for c in want)
        for cut in range(1, sum(r is not None for r, _ in got), 7):
            before = got[:cut]
            field = resume_field([r for r, _ in before if r is not None], answer_id, created)
            rest = http.post("/v1/chat/completions", json={**body, RESUME_FIELD: field}, headers=RESUMABLE)
            chunks = by_choice([d for _, d in before + events(rest.text) if d is not None])[0]
            assert [without_id(c) for c in chunks] == want, f"cut at event {cut}"


BAD = [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": 7}}}}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),
    ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "two words"}}], "tool_choice": "required"}, "tools.0.function.name"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tool_choice": "none", "messages": [*ASK, {"role": "tool", "content": "x"}]}, "messages[1].tool_call_id"),
    ({"tool_choice": "none", "messages": [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": "{oops"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({}, "tool_choice"),  # "auto" on a server started without --enable-auto-tool-choice
]  # fmt: skip


@pytest.mark.parametrize(("fields", "param"), BAD)
def test_bad_tools_are_400s_naming_the_field_before_anything_is_queued(fields: dict[str, Any], param: str) -> None:
    engine = FakeEngine(script="x", max_model_len=1024)
    with serving_fake(engine) as s:
        body = {"model": MODEL, "messages": ASK, "tools": TOOLS, **fields}
        resp = httpx.post(f"{s.url}/v1/chat/completions", json={k: v for k, v in body.items() if v is not None})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert (error["param"], error["type"]) == (param, "invalid_request_error"), error
    assert engine.admitted == [] and not engine.waiting
