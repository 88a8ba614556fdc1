"""Request-size limits and event-loop hygiene: a large body is refused with a 413 before it is buffered,
tokenizing runs off the event loop, and /docs and /openapi.json are off unless asked for."""

from __future__ import annotations

import socket
import threading

import httpx

from tests.server.fake_engine import FakeEngine, FakeTokenizer
from tests.support.wait import wait_for


def test_body_over_the_limit_is_a_413_in_the_openai_shape(fake_server) -> None:
    server = fake_server(max_request_body_bytes=1000)
    with server.http() as http:
        r = http.post("/v1/completions", json={"model": "fake", "prompt": "x" * 2000, "max_tokens": 1})
        assert r.status_code == 413
        assert r.json() == {
            "error": {
                "message": "request body is larger than 1000 bytes",
                "type": "invalid_request_error",
                "param": None,
                "code": "body_too_large",
            }
        }
        ok = http.post("/v1/completions", json={"model": "fake", "prompt": "x" * 100, "max_tokens": 1})
        assert ok.status_code == 200


def test_chunked_body_is_counted_as_it_arrives(fake_server) -> None:
    server = fake_server(max_request_body_bytes=1000)

    def chunks():  # no Content-Length: the limit must count the chunks themselves
        yield b'{"model": "fake", "prompt": "'
        for _ in range(20):
            yield b"x" * 100
        yield b'", "max_tokens": 1}'

    with server.http() as http:
        r = http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


class BlockingTokenizer(FakeTokenizer):
    """Holds every encode of a long text until released, to show what the event loop does meanwhile."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > 1000:
            self.entered.set()
            assert self.release.wait(30), "never released"
        return super().encode(text, add_special_tokens)


def test_health_answers_while_a_prompt_is_tokenized(fake_server) -> None:
    # An ordering check, no timing: /health must answer while the tokenizer is still busy.
    engine = FakeEngine(max_model_len=2048, num_blocks=1024)
    tokenizer = BlockingTokenizer()
    engine.tokenizer = tokenizer
    server = fake_server(engine=engine)
    answer: list[httpx.Response] = []
    body = {"model": "fake", "prompt": "y" * 1500, "max_tokens": 1}
    worker = threading.Thread(
        target=lambda: answer.append(httpx.post(f"{server.url}/v1/completions", json=body, timeout=30))
    )
    worker.start()
    try:
        assert tokenizer.entered.wait(10)
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
        assert not answer  # the prompt was still being tokenized when /health answered
    finally:
        tokenizer.release.set()
        worker.join(30)
    assert answer[0].status_code == 200


def test_docs_and_openapi_are_off_by_default(fake_server) -> None:
    with fake_server().http() as http:
        assert http.get("/docs").status_code == 404
        assert http.get("/openapi.json").status_code == 404
    with fake_server(enable_docs=True).http() as http:
        assert http.get("/openapi.json").json()["info"]["title"] == "Folio engine"
        assert http.get("/docs").status_code == 200


def test_oversized_content_length_is_refused_before_the_body_is_sent(fake_server) -> None:
    server = fake_server(max_request_body_bytes=1000)
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000000\r\n\r\n"
        )
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 413")


def test_queue_limit_counts_sequences_not_requests(fake_server) -> None:
    # The case, scaled: one request of 4 prompts × n=2 (8 sequences) under a queue of 4.
    engine = FakeEngine(max_num_seqs=1, step_delay=0.01)
    server = fake_server(engine=engine, max_queued_requests=4)
    with server.http() as http:
        r = http.post(
            "/v1/completions", json={"model": "fake", "prompt": ["a", "b", "c", "d"], "n": 2, "max_tokens": 1}
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_sequences"
        assert r.json()["error"]["param"] == "n"
        blocker = threading.Thread(
            target=lambda: httpx.post(
                f"{server.url}/v1/completions",
                json={"model": "fake", "prompt": "x", "max_tokens": 150},
                timeout=30,
            )
        )
        blocker.start()
        waiter = threading.Thread(
            target=lambda: httpx.post(
                f"{server.url}/v1/completions",
                json={"model": "fake", "prompt": ["p", "q"], "max_tokens": 1},
                timeout=30,
            )
        )
        wait_for(lambda: server.app.state.server.engine.stats.num_running == 1)
        waiter.start()
        wait_for(lambda: server.app.state.server.engine.num_queued == 2)
        # 2 queued + 3 new > 4: refused whole, though it is a single request
        full = http.post(
            "/v1/completions", json={"model": "fake", "prompt": ["a", "b", "c"], "max_tokens": 1}
        )
        assert full.status_code == 503 and full.json()["error"]["code"] == "server_overloaded"
        fits = threading.Thread(
            target=lambda: httpx.post(
                f"{server.url}/v1/completions",
                json={"model": "fake", "prompt": ["a", "b"], "max_tokens": 1},
                timeout=30,
            )
        )
        fits.start()  # 2 + 2 <= 4
        wait_for(lambda: server.app.state.server.engine.num_queued == 4)
        for t in (blocker, waiter, fits):
            t.join(30)


def test_sequences_per_request_cap_is_configurable(fake_server) -> None:
    server = fake_server(max_sequences_per_request=3)
    with server.http() as http:
        chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "n": 4, "max_tokens": 1}
        r = http.post("/v1/chat/completions", json=chat)
        assert r.status_code == 400 and "at most 3" in r.json()["error"]["message"]
        assert http.post("/v1/chat/completions", json={**chat, "n": 3}).status_code == 200
