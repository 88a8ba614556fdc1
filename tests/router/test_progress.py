"""The event framing and records of a relayed answer (operator/router/progress.py), byte by byte."""

from __future__ import annotations

import json

from folio.engine.server.continuation import Record
from folio.operator.router.progress import Progress


def event(data: str, record: Record | None = None) -> bytes:
    return (record.line() if record is not None else "").encode() + f"data: {data}\n\n".encode()


def test_a_chunk_without_records_passes_on_as_the_same_bytes() -> None:
    progress = Progress(streamed=True)
    chunk = event('{"choices": []}') + event('{"choices": [1]}')
    assert progress.feed(chunk) is chunk
    assert not progress.ended and progress.choices == {}


def test_records_are_taken_out_and_read() -> None:
    progress = Progress(streamed=True)
    out = progress.feed(
        event('{"a": 1}', Record(index=0, token_ids=(5, 6)))
        + event('{"b": 2}', Record(index=1, token_ids=()))
        + event('{"c": 3}', Record(index=0, token_ids=(7,), finish_reason="stop", stop_reason="\n"))
    )
    assert out == b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: {"c": 3}\n\n'
    assert progress.tokens(0) == [5, 6, 7] and progress.tokens(1) == []
    assert progress.choices[0].finish_reason == "stop" and progress.choices[0].stop_reason == "\n"
    assert progress.choices[0].token_ids.itemsize == 4  # compact: a few bytes a token
    progress.response_id, progress.created = "cmpl-1", 17
    assert progress.resume() == {"id": "cmpl-1", "created": 17, "choices": [
        {"index": 0, "token_ids": [5, 6, 7], "finish_reason": "stop", "stop_reason": "\n"},
        {"index": 1, "token_ids": [], "finish_reason": None, "stop_reason": None},
    ]}  # fmt: skip
    assert progress.feed(b"data: [DONE]\n\n") == b"data: [DONE]\n\n" and progress.ended


def test_an_unfinished_event_is_held_until_it_is_whole() -> None:
    progress = Progress(streamed=True)
    whole = event('{"x": "y"}', Record(index=0, token_ids=(1,)))
    for cut in range(1, len(whole)):
        progress.restart()
        progress.choices.clear()
        assert progress.feed(whole[:cut]) == b""
        assert progress.tokens(0) == []  # the record of an event the client does not have yet
        assert progress.feed(whole[cut:]) == b'data: {"x": "y"}\n\n'
        assert progress.tokens(0) == [1]
    progress.feed(whole[:10])
    progress.restart()  # a new attempt: the half event of the old one is nobody's
    assert progress.held == 0


def test_record_text_inside_a_data_line_is_text() -> None:
    progress = Progress(streamed=True)
    data = json.dumps({"text": ": folio-resume {\"index\": 0}"})
    chunk = event(data, Record(index=0, token_ids=(3,)))
    assert progress.feed(chunk) == f"data: {data}\n\n".encode()
    assert progress.tokens(0) == [3] and not progress.lost


def test_a_failed_record_ends_what_the_client_gets() -> None:
    progress = Progress(streamed=True)
    chunk = (
        event('{"a": 1}', Record(index=0, token_ids=(1,)))
        + Record(failed="shutting_down", message="bye").line().encode()
        + b'data: {"error": {}}\n\ndata: [DONE]\n\n'
    )
    assert progress.feed(chunk) == b'data: {"a": 1}\n\n'
    assert progress.failed is not None and progress.failed.failed == "shutting_down"
    assert not progress.ended
    progress.restart()
    assert progress.failed is None


def test_an_unstreamed_answer_is_its_final_json_and_its_records_carry_logprobs() -> None:
    progress = Progress(streamed=False)
    records = [
        Record(index=0, token_ids=(1,), logprobs=[[[1, -0.5]]], prompt_logprobs=[None, [[9, -1.0]]]),
        Record(index=0, token_ids=(2,), logprobs=[[[2, -0.25]]], finish_reason="length"),
    ]
    chunk = b"".join(r.line().encode() + b"\n" for r in records)
    assert progress.feed(chunk) == b"" and progress.final is None
    assert progress.feed(b'data: {"id": "x"}\n\n') == b""
    assert progress.ended and json.loads(progress.final or b"") == {"id": "x"}
    progress.response_id, progress.created = "x", 1
    assert progress.resume()["choices"] == [{
        "index": 0, "token_ids": [1, 2], "finish_reason": "length", "stop_reason": None,
        "logprobs": [[[1, -0.5]], [[2, -0.25]]], "prompt_logprobs": [None, [[9, -1.0]]],
    }]  # fmt: skip


def test_an_unreadable_record_makes_the_answer_lost() -> None:
    progress = Progress(streamed=True)
    out = progress.feed(b': folio-resume {"index": "zero"}\ndata: {}\n\n')
    assert out == b"data: {}\n\n"  # still stripped: records never reach the client
    assert progress.lost


def test_a_record_only_event_and_the_final_json_in_one_chunk() -> None:
    for streamed in (False, True):
        progress = Progress(streamed=streamed)
        record = Record(index=0, token_ids=(4,), finish_reason="length").line().encode()
        out = progress.feed(record + b'\ndata: {"id": "x"}\n\n')
        assert progress.tokens(0) == [4]
        if streamed:
            assert out == b'data: {"id": "x"}\n\n'
        else:
            assert out == b"" and progress.final == b'{"id": "x"}' and progress.ended


def test_records_are_read_in_batches_and_in_order() -> None:
    progress = Progress(streamed=True)
    for i in range(200):  # past several batches, one event a chunk and several a chunk
        chunk = event("{}", Record(index=i % 2, token_ids=(i,)))
        progress.feed(chunk if i % 3 else chunk + event("{}", Record(index=0, token_ids=())))
    assert progress.tokens(0) == list(range(0, 200, 2)) and progress.tokens(1) == list(range(1, 200, 2))


def test_a_batch_that_only_looks_usual_is_read_in_full() -> None:
    progress = Progress(streamed=True)
    progress.feed(event("{}", Record(index=0, token_ids=(1,))))
    for payload in (b'{"index":0,"token_ids":[2]}', b'{"index":0,"token_ids":[3,4]}', b'{"index":0,"token_ids":[]}'):
        progress.feed(b": folio-resume " + payload + b"\ndata: {}\n\n")
    progress.feed(event("{}", Record(index=0, token_ids=(5,), finish_reason="stop")))
    assert progress.tokens(0) == [1, 2, 3, 4, 5] and progress.choices[0].finish_reason == "stop"
    for bad in (b'{"index":0,"token_ids":[1.5]}', b'{"index":0,"token_ids":[99999999999]}'):
        progress = Progress(streamed=True)
        progress.feed(event("{}", Record(index=0, token_ids=(1,))))
        progress.feed(b": folio-resume " + bad + b"\ndata: {}\n\n")
        assert progress.lost and progress.tokens(0)[:1] == [1]
