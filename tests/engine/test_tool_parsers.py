"""The tool-call parsers and streams: every format's calls found in whole answers, the same said however
the answer is cut into pieces, malformed calls given back as content, the constrained streams' names and
argument fragments, and the ids calls get."""

from __future__ import annotations

import json
import random

import pytest

from folio.engine.tools.calls import CallDelta, FunctionCall, call_id, merge_calls
from folio.engine.tools.json_stream import NamedStream, RequiredStream
from folio.engine.tools.parser import Said
from folio.engine.tools.parsers import FAMILY_DEFAULTS, PARSERS, parser_for

TOOLS = {"get_weather", "get_time"}


def run(stream, pieces: list[str]) -> tuple[str, list[FunctionCall]]:
    said = Said()
    for i, piece in enumerate(pieces):
        part = stream.feed(piece, final=i == len(pieces) - 1)
        said.content += part.content
        said.calls += part.calls
    return said.content, merge_calls(said.calls)


def cuts(text: str, seed: int) -> list[str]:
    """``text`` cut at random places (pieces of 1 to 6 characters), as a stream brings it."""
    rng, pieces, at = random.Random(seed), [], 0
    while at < len(text):
        step = rng.randint(1, 6)
        pieces.append(text[at : at + step])
        at += step
    return pieces or [""]


CASES = [
    # (parser, answer, content, calls)
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "Let me look.", [("get_weather", {"city": "Paris"})]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>\n'
               '<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>',
     "", [("get_weather", {"city": "Oslo"}), ("get_time", {"zone": "CET"})]),
    ("hermes", "No tools needed: 2 < 3 and <tool is not a tag.", "No tools needed: 2 < 3 and <tool is not a tag.", []),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>',
     "", [("get_weather", {"city": "Rome"})]),  # arguments as a JSON string, as some models write them
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Lima"}}', "", [("get_weather", {"city": "Lima"})]),
    ("llama3_json", '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}; '
                    '{"name": "get_weather", "arguments": {"city": "Kyiv"}}',
     "", [("get_time", {"zone": "UTC"}), ("get_weather", {"city": "Kyiv"})]),
    ("llama3_json", 'Sure: {"name": "get_weather", "parameters": {}}', 'Sure: {"name": "get_weather", "parameters": {}}', []),
    ("mistral", 'On it.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice"}}, '
                '{"name": "get_time", "arguments": {"zone": "CET"}}]',
     "On it.", [("get_weather", {"city": "Nice"}), ("get_time", {"zone": "CET"})]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Bern"}[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}',
     "", [("get_weather", {"city": "Bern"}), ("get_time", {"zone": "CET"})]),
    ("pythonic", '[get_weather(city="Paris", days=3), get_time(zone="CET")]',
     "", [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {"zone": "CET"})]),
    ("pythonic", '<|python_start|>[get_time(zone="UTC")]<|python_end|>', "", [("get_time", {"zone": "UTC"})]),
    ("pythonic", "The answer is [1, 2].", "The answer is [1, 2].", []),
]  # fmt: skip


@pytest.mark.parametrize(("name", "answer", "content", "calls"), CASES)
def test_each_format_reads_the_same_whole_and_cut_into_pieces(name, answer, content, calls) -> None:
    parser = PARSERS[name]()
    whole = parser.extract(answer, TOOLS)
    expected = [FunctionCall(n, json.dumps(a, ensure_ascii=False)) for n, a in calls]
    assert (whole.content, merge_calls(whole.calls)) == (content, expected)
    for seed in range(20):
        assert run(parser.stream(TOOLS), cuts(answer, seed)) == (content, expected)


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'),  # bad JSON
        ("hermes", '<tool_call>{"name": "launch_missiles", "arguments": {}}</tool_call>'),  # not offered
        ("hermes", 'Cut short <tool_call>{"name": "get_weather", "argu'),  # the answer ended inside the block
        ("hermes", '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>'),  # not an object
        ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Lima"}} and more'),
        ("mistral", "[TOOL_CALLS]not json at all"),
        ("pythonic", "[get_weather(__import__('os').system('x'))]"),  # never run: not a literal
        ("pythonic", "[get_weather(**{'city': 'Paris'})]"),
    ],
)
def test_a_malformed_call_is_content_exactly_as_written(name: str, answer: str) -> None:
    parser = PARSERS[name]()
    for pieces in ([answer], cuts(answer, 1), cuts(answer, 2)):
        assert run(parser.stream(TOOLS), pieces) == (answer, [])


def test_content_is_said_as_it_comes_holding_back_only_a_possible_marker() -> None:
    stream = PARSERS["hermes"]().stream(TOOLS)
    assert stream.feed("Hello <tool").content == "Hello"  # "<tool" may begin <tool_call>; the space waits too
    assert stream.feed("box>").content == " <toolbox>"
    said = stream.feed('<tool_call>{"name": "get_time", "arguments": {}}')
    assert said == Said()  # a block is held until it closes
    assert stream.feed("</tool_call>").calls == [CallDelta(0, "get_time", "{}")]


def test_without_parallel_tool_calls_only_the_first_call_is_said() -> None:
    answer = '[get_weather(city="A"), get_time(zone="B")]'
    _, calls = run(PARSERS["pythonic"]().stream(TOOLS, parallel=False), [answer])
    assert calls == [FunctionCall("get_weather", '{"city": "A"}')]


def test_required_stream_names_each_call_then_streams_its_arguments() -> None:
    answer = ('[{"name": "get_weather", "parameters": {"city": "Pa\\"ris}", "tags": ["a", {"b": 1}]}}, '
              '{"name": "get_time", "parameters": {"zone": "CET"}}]')  # fmt: skip
    stream = RequiredStream()
    deltas = [d for ch in answer for d in stream.feed(ch).calls]
    assert [d.name for d in deltas if d.name] == ["get_weather", "get_time"]
    first_args = [d.index for d in deltas if d.name is None]
    assert first_args and all(i in (0, 1) for i in first_args)
    assert deltas[0] == CallDelta(0, "get_weather")  # the name comes first, then the arguments in fragments
    calls = merge_calls(deltas)
    assert [json.loads(c.arguments) for c in calls] == [{"city": 'Pa"ris}', "tags": ["a", {"b": 1}]}, {"zone": "CET"}]
    for seed in range(10):  # any cut says the same
        assert run(RequiredStream(), cuts(answer, seed))[1] == calls


def test_required_stream_holds_arguments_written_before_the_name() -> None:
    _, calls = run(RequiredStream(), ['[{"parameters": {"zone": "UTC"}, "name": "get_time"}]'])
    assert calls == [FunctionCall("get_time", '{"zone": "UTC"}')]


def test_named_stream_names_the_call_at_once_and_streams_the_answer_as_its_arguments() -> None:
    stream = NamedStream("get_time")
    assert stream.feed('{"zo').calls == [CallDelta(0, "get_time", '{"zo')]
    assert stream.feed('ne": "CET"}', final=True).calls == [CallDelta(0, None, 'ne": "CET"}')]
    assert NamedStream("get_time").feed("", final=True).calls == [CallDelta(0, "get_time", "")]


def test_call_ids_are_derived_so_a_continuing_replica_names_calls_alike() -> None:
    a = call_id("chatcmpl-1", 0, 0)
    assert a == call_id("chatcmpl-1", 0, 0) and a.startswith("call_") and len(a) == 5 + 24
    assert len({a, call_id("chatcmpl-1", 0, 1), call_id("chatcmpl-1", 1, 0), call_id("chatcmpl-2", 0, 0)}) == 4
    mistral = call_id("chatcmpl-1", 0, 0, length=9, prefix="")
    assert len(mistral) == 9 and mistral.isalnum()  # what Mistral's templates accept


def test_each_family_has_its_default_parser_and_others_must_name_one() -> None:
    assert parser_for(None, "qwen2").name == "hermes"
    assert parser_for(None, "llama").name == "llama3_json"
    assert parser_for(None, "mistral").name == "mistral"
    assert parser_for("pythonic", "llama").name == "pythonic"
    assert set(FAMILY_DEFAULTS.values()) <= set(PARSERS)
    with pytest.raises(ValueError, match="pass --tool-call-parser"):
        parser_for(None, "gemma3_text")
    with pytest.raises(ValueError, match="unknown tool-call parser 'xml'"):
        parser_for("xml", "qwen2")
