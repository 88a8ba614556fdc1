"""The resumable mode and continuations (`folio.engine.server.continuation`), through the app on a tiny real
model: records that strip to the normal answer, and an answer cut at any event and continued as the router
does (its ``folio_resume`` built from the records before the cut) that is, choice by choice, the answer
that was never cut."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from folio.engine.config import EngineConfig
from folio.engine.llm_engine import LLMEngine
from folio.engine.server.async_engine import RequestAborted
from folio.engine.server.continuation import (
    CREATED_HEADER,
    RECORD_PREFIX,
    RESPONSE_ID_HEADER,
    RESUMABLE_HEADER,
    RESUME_FIELD,
    Record,
)
from tests.server.conftest import MODEL, Running, serving_fake

PREFIX = RECORD_PREFIX.decode()
RESUMABLE = {RESUMABLE_HEADER: "1"}
MESSAGES = [{"role": "user", "content": "Tell me about foxes"}]
Event = tuple[Record | None, str | None]


@pytest.fixture(scope="module")
def server(tiny_llama: Path) -> Iterator[Running]:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), dtype="float32", max_model_len=256))
    with serving_fake(engine) as running:
        yield running


@pytest.fixture
def http(server: Running) -> Iterator[httpx.Client]:
    with server.http() as client:
        yield client


def events(text: str) -> list[Event]:
    """Each event's record (if any) and data (if any)."""
    out: list[Event] = []
    for block in text.split("\n\n"):
        if not block.strip("\n"):
            continue
        record = data = None
        for line in filter(None, block.split("\n")):
            if line.startswith(PREFIX):
                record = Record.parse(line[len(PREFIX) :].encode())
            else:
                assert line.startswith("data: "), f"an unexpected line {line!r}"
                data = line.removeprefix("data: ")
        out.append((record, data))
    return out


def stripped(text: str) -> str:
    """The answer as any SSE reader (and the router's client) sees it: without the record lines."""
    return "".join(line + "\n" for line in text.split("\n") if not line.startswith(PREFIX))[:-1]


def resume_field(records: list[Record], answer_id: str, created: int) -> dict[str, Any]:
    """What the router sends: each choice's tokens so far (with logprobs, prompt logprobs), how it finished."""
    choices: dict[int, dict[str, Any]] = {}
    for r in records:
        assert r.index is not None
        c = choices.setdefault(r.index, {"index": r.index, "token_ids": []})
        c["token_ids"] += r.token_ids
        if r.finish_reason is not None:
            c["finish_reason"], c["stop_reason"] = r.finish_reason, r.stop_reason
        if r.logprobs is not None:
            c.setdefault("logprobs", []).extend(r.logprobs)
        if r.prompt_logprobs is not None:
            c["prompt_logprobs"] = r.prompt_logprobs
    return {"id": answer_id, "created": created, "choices": list(choices.values())}


def without_id(chunk: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in chunk.items() if k not in ("id", "created")}


def by_choice(datas: list[str]) -> dict[int, list[dict[str, Any]]]:
    """The streamed chunks of each choice, in order (the usage chunk under -1)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for data in datas:
        if data == "[DONE]":
            continue
        chunk = json.loads(data)
        index = chunk["choices"][0]["index"] if chunk["choices"] else -1
        out.setdefault(index, []).append(chunk)
    return out


def assert_same(got: Any, want: Any, where: str = "") -> None:
    """Equal, but for float noise: the tokens before the seam are prefilled again, not decoded one by one,
    so logprobs after it may differ in the last bits (tokens, text and offsets do not)."""
    if isinstance(want, float) and isinstance(got, float):
        assert got == pytest.approx(want, abs=1e-4), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), where
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def split_stop(http: httpx.Client, path: str, body: dict[str, Any]) -> str:
    """A stop string that ends choice 0 early and never shows in choice 1."""
    answer = http.post(path, json={**body, "stream": False}).json()
    texts = [c["text"] if "text" in c else c["message"]["content"] for c in answer["choices"]]
    for at in range(2, len(texts[0]) - 3):
        stop = texts[0][at : at + 3]
        if stop not in texts[1] and texts[0].find(stop) == at and stop.strip():
            return stop
    pytest.skip("no stop string separates the two choices of this random model")


BODIES = {
    "/v1/completions": {
        "model": MODEL, "prompt": "The quick brown fox", "max_tokens": 12, "n": 2, "temperature": 0.8,
        "seed": 11, "ignore_eos": True, "logprobs": 2,
    },
    "/v1/chat/completions": {
        "model": MODEL, "messages": MESSAGES, "max_tokens": 12, "n": 2, "temperature": 0.8, "seed": 11,
        "ignore_eos": True, "logprobs": True, "top_logprobs": 2,
    },
}  # fmt: skip


def test_without_the_header_nothing_changes(http: httpx.Client) -> None:
    for path, body in BODIES.items():
        for stream in (False, True):
            resp = http.post(path, json={**body, "stream": stream})
            assert resp.status_code == 200
            assert PREFIX.strip() not in resp.text and "token_ids" not in resp.text
            assert RESUMABLE_HEADER.lower() not in resp.headers and RESPONSE_ID_HEADER.lower() not in resp.headers
            assert resp.headers["content-type"].startswith("text/event-stream" if stream else "application/json")


@pytest.mark.parametrize("path", list(BODIES))
def test_records_strip_to_the_normal_answer(http: httpx.Client, path: str) -> None:
    body = {**BODIES[path], "return_token_ids": True, "stream_options": {"include_usage": True}}
    # streamed: every event of a choice's output has its record; stripped, the answer is the normal one
    plain = http.post(path, json={**body, "stream": True})
    resumable = http.post(path, json={**body, "stream": True}, headers=RESUMABLE)
    assert resumable.headers[RESUMABLE_HEADER] == "1"
    got = events(resumable.text)
    chunks = [json.loads(d) for _, d in got if d != "[DONE]"]
    assert {c["id"] for c in chunks} == {resumable.headers[RESPONSE_ID_HEADER]}
    assert {c["created"] for c in chunks} == {int(resumable.headers[CREATED_HEADER])}
    assert [without_id(json.loads(d)) for _, d in events(stripped(resumable.text)) if d != "[DONE]"] == [
        without_id(json.loads(d)) for _, d in events(plain.text) if d != "[DONE]"
    ]
    for (record, data), chunk in zip(got, [*chunks, None], strict=True):
        assert (record is None) == (chunk is None or not chunk["choices"]), data  # usage and [DONE]: none
        if record is not None:
            assert chunk is not None and record.index == chunk["choices"][0]["index"]
            assert list(record.token_ids) == (chunk["choices"][0].get("token_ids") or [])
    # unstreamed: records, then the whole response, exactly as it is answered otherwise
    whole = http.post(path, json=body).json()
    resumable = http.post(path, json=body, headers=RESUMABLE)
    assert resumable.headers["content-type"].startswith("text/event-stream")
    got = events(resumable.text)
    assert all(d is None for _, d in got[:-1]) and got[-1][0] is None and "[DONE]" not in resumable.text
    final = json.loads(got[-1][1] or "")
    assert without_id(final) == without_id(whole) and final["id"] == resumable.headers[RESPONSE_ID_HEADER]
    for choice in final["choices"]:
        records = [r for r, _ in got[:-1] if r is not None and r.index == choice["index"]]
        assert [t for r in records for t in r.token_ids] == choice["token_ids"]
        assert sum(len(r.logprobs or []) for r in records) == len(choice["token_ids"])
        assert (records[-1].finish_reason, records[-1].stop_reason) == (choice["finish_reason"], choice["stop_reason"])


@pytest.mark.parametrize("path", list(BODIES))
def test_a_stream_cut_anywhere_continues_seamlessly(http: httpx.Client, path: str) -> None:
    body = {**BODIES[path], "stream": True, "stream_options": {"include_usage": True}}
    body["stop"] = [split_stop(http, path, body)]  # choice 0 finishes early, choice 1 runs on
    full = http.post(path, json=body, headers=RESUMABLE)
    answer_id, created = full.headers[RESPONSE_ID_HEADER], int(full.headers[CREATED_HEADER])
    got = events(full.text)
    want = by_choice([d for _, d in got if d is not None])
    assert want[0][-1]["choices"][0]["finish_reason"] == "stop" and len(want[0]) < len(want[1])
    num_choice_events = sum(r is not None for r, _ in got)
    for cut in range(num_choice_events):
        before = got[:cut]
        field = resume_field([r for r, _ in before if r is not None], answer_id, created)
        rest = http.post(path, json={**body, RESUME_FIELD: field}, headers=RESUMABLE)
        assert rest.status_code == 200, rest.text
        assert rest.headers[RESPONSE_ID_HEADER] == answer_id and rest.headers[CREATED_HEADER] == str(created)
        after = events(rest.text)
        assert after[-1] == (None, "[DONE]")
        seamed = by_choice([d for _, d in before if d is not None] + [d for _, d in after if d is not None])
        assert_same(seamed, want, f"cut after event {cut}")  # same id, created, chunks, logprobs, usage


@pytest.mark.parametrize("path", list(BODIES))
def test_an_unstreamed_answer_cut_anywhere_continues_seamlessly(http: httpx.Client, path: str) -> None:
    body = {**BODIES[path], "stream": False}
    body["stop"] = [split_stop(http, path, body)]
    if path == "/v1/completions":
        body["echo"] = True  # the prompt's logprobs are carried across the seam too
    full = http.post(path, json=body, headers=RESUMABLE)
    got = events(full.text)
    records, whole = [r for r, _ in got[:-1] if r is not None], got[-1][1]
    answer = json.loads(whole or "")
    assert answer["choices"][0]["finish_reason"] == "stop"
    for cut in range(len(records) + 1):
        field = resume_field(records[:cut], answer["id"], answer["created"])
        rest = http.post(path, json={**body, RESUME_FIELD: field}, headers=RESUMABLE)
        assert rest.status_code == 200, rest.text
        record, data = events(rest.text)[-1]
        assert record is None and data is not None
        assert_same(json.loads(data), answer, f"cut after record {cut}")
        if cut == len(records):  # nothing left to run: the whole answer from what the client carried
            assert data == whole


def test_bad_continuations_are_400s(http: httpx.Client) -> None:
    path, body = "/v1/completions", {**BODIES["/v1/completions"], "logprobs": None}
    tokens = [5, 6, 7]
    bad = [
        [{"index": 2, "token_ids": tokens}],  # n=2: choices 0 and 1 only
        [{"index": 0, "token_ids": tokens}, {"index": 0, "token_ids": tokens}],
        [{"index": 0, "token_ids": [10**6]}],  # past the vocabulary
        [{"index": 0, "token_ids": [-1]}],
        [{"index": 0, "token_ids": [5] * 12}],  # max_tokens 12: no room left
        [{"index": -1, "token_ids": tokens}],
    ]
    for choices in bad:
        resp = http.post(path, json={**body, RESUME_FIELD: {"id": "cmpl-x", "created": 1, "choices": choices}})
        assert resp.status_code == 400, (choices, resp.text)
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"].startswith(RESUME_FIELD), error
    # an unstreamed answer with logprobs shows every token's: the client must carry those it has
    field = {"id": "cmpl-x", "created": 1, "choices": [{"index": 0, "token_ids": tokens}]}
    resp = http.post(path, json={**BODIES[path], RESUME_FIELD: field})
    assert resp.status_code == 400 and "logprobs" in resp.json()["error"]["message"]  # unstreamed: carried


@pytest.mark.parametrize("stream", [True, False])
def test_an_aborted_answer_ends_with_a_failed_record(server: Running, stream: bool) -> None:
    body = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 200, "ignore_eos": True, "stream": stream}
    serving = server.app.state.serving
    with server.http() as http, http.stream("POST", "/v1/completions", json=body, headers=RESUMABLE) as resp:
        lines = resp.iter_lines()
        first = next(lines)
        assert first.startswith(PREFIX)
        fired = threading.Event()
        loop = serving.engine.loop
        loop.call_soon_threadsafe(lambda: (serving.engine.abort_all(RequestAborted("the server is draining")), fired.set()))
        assert fired.wait(10)
        text = first + "\n" + "\n".join(lines)
    got = events(text)
    tail = got[-2:] if stream else got[-1:]
    record, data = tail[0]
    assert record is not None and record.failed == "shutting_down" and "draining" in (record.message or "")
    assert json.loads(data or "")["error"]["code"] == "shutting_down"
    assert (got[-1] == (None, "[DONE]")) == stream


def test_return_token_ids(http: httpx.Client, server: Running) -> None:
    tokenizer = server.engine.tokenizer
    body = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    choice = http.post("/v1/completions", json={**body, "return_token_ids": True}).json()["choices"][0]
    assert choice["prompt_token_ids"] == tokenizer("The quick brown fox").input_ids and len(choice["token_ids"]) == 5
    chunks = by_choice([d for _, d in events(http.post("/v1/completions", json={
        **body, "return_token_ids": True, "stream": True}).text)])[0]  # fmt: skip
    assert "prompt_token_ids" in chunks[0]["choices"][0] and all("prompt_token_ids" not in c["choices"][0] for c in chunks[1:])
    assert [t for c in chunks for t in c["choices"][0]["token_ids"]] == choice["token_ids"]
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 5, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    whole = http.post("/v1/chat/completions", json=chat).json()
    assert len(whole["prompt_token_ids"]) == whole["usage"]["prompt_tokens"] and len(whole["choices"][0]["token_ids"]) == 5
    chunks = by_choice([d for _, d in events(http.post("/v1/chat/completions", json={**chat, "stream": True}).text)])[0]
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"] and all("prompt_token_ids" not in c for c in chunks[1:])
    assert [t for c in chunks[1:] for t in c["choices"][0]["token_ids"]] == whole["choices"][0]["token_ids"]
