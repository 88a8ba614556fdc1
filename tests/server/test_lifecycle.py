"""Client disconnects and the shutdown drain, on the fake engine (its block count is exact)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading

import httpx
import pytest
import uvicorn

from folio.engine.server.app import build_app
from folio.engine.server.lifecycle import DrainingServer
from folio.engine.server.serving import ServingConfig
from tests.server.conftest import free_port
from tests.server.fake_engine import FakeEngine
from tests.support.wait import wait_for

SLOW = {"model": "fake", "prompt": "hi", "max_tokens": 200, "temperature": 0}


def test_disconnect_mid_stream_aborts_and_frees_blocks(fake_server) -> None:
    engine = FakeEngine(step_delay=0.01)
    server = fake_server(engine=engine)
    with server.http() as http, http.stream("POST", "/v1/completions", json={**SLOW, "stream": True}) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(ln for ln in lines if ln)
        assert engine.used_blocks > 0
    wait_for(lambda: not engine.has_unfinished_requests())
    assert len(engine.aborted) == 1
    wait_for(lambda: server.app.state.server.engine.stats.kv_cache_usage == 0.0)
    with server.http() as http:
        metrics = http.get("/metrics").text
    assert 'vllm:kv_cache_usage_perc{model_name="fake"} 0.0' in metrics
    assert 'vllm:request_success_total{finished_reason="abort",model_name="fake"} 1.0' in metrics


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_disconnect_mid_request_aborts_and_frees_blocks(fake_server, path: str) -> None:
    engine = FakeEngine(step_delay=0.01)
    server = fake_server(engine=engine)
    body = (
        SLOW
        if path.endswith("/completions") and "chat" not in path
        else {
            "model": "fake",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 200,
        }
    )
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=server.url, timeout=0.3) as http:
        http.post(path, json=body)  # gives up after 0.3 s of a ~2 s generation, closing the connection
    wait_for(lambda: len(engine.aborted) == 1)
    assert not engine.has_unfinished_requests()
    assert engine.used_blocks == 0


def _drain(server, timeout: float) -> asyncio.Future[bool]:
    state = server.app.state.server
    return asyncio.run_coroutine_threadsafe(state.drain(timeout), state.engine.loop)


def test_drain_finishes_in_flight_and_refuses_new_work(fake_server) -> None:
    server = fake_server(engine=FakeEngine(step_delay=0.005))
    results: list[dict] = []

    def call(stream: bool) -> None:
        with server.http() as http:
            if stream:
                text = http.post("/v1/completions", json={**SLOW, "stream": True}).text
                events = [ln.removeprefix("data: ") for ln in text.splitlines() if ln]
                assert events[-1] == "[DONE]"
                results.append(json.loads(events[-2]))
            else:
                results.append(http.post("/v1/completions", json=SLOW).json())

    threads = [threading.Thread(target=call, args=(s,)) for s in (True, False, True)]
    for t in threads:
        t.start()
    wait_for(lambda: server.app.state.server.engine.stats.num_running == 3)
    drained = _drain(server, timeout=30)
    with server.http() as http:
        wait_for(lambda: http.get("/ready").status_code == 503)
        refused = http.post("/v1/completions", json=SLOW)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "shutting_down"
        assert http.get("/health").status_code == 200  # alive while draining: no restart mid-drain
    assert drained.result(30) is True
    for t in threads:
        t.join(10)
    assert [r["choices"][0]["finish_reason"] for r in results] == ["length"] * 3


def test_drain_timeout_answers_what_is_left_with_503(fake_server) -> None:
    server = fake_server(engine=FakeEngine(step_delay=0.02))
    answers: dict[str, str] = {}

    def plain() -> None:
        with server.http() as http:
            answers["plain"] = http.post("/v1/completions", json=SLOW).text

    def streamed() -> None:
        with server.http() as http:
            answers["stream"] = http.post("/v1/completions", json={**SLOW, "stream": True}).text

    threads = [threading.Thread(target=plain), threading.Thread(target=streamed)]
    for t in threads:
        t.start()
    wait_for(lambda: server.app.state.server.engine.stats.num_running == 2)
    assert _drain(server, timeout=0.2).result(30) is False
    for t in threads:
        t.join(10)
    assert json.loads(answers["plain"])["error"]["code"] == "shutting_down"
    events = [ln.removeprefix("data: ") for ln in answers["stream"].splitlines() if ln]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "shutting_down"
    wait_for(lambda: not server.engine.has_unfinished_requests())


def test_disconnect_while_queued_removes_the_waiting_request(fake_server) -> None:
    engine = FakeEngine(max_num_seqs=1, step_delay=0.01)
    server = fake_server(engine=engine)
    state = server.app.state.server.engine

    def blocker() -> None:
        with server.http() as http:
            http.post("/v1/completions", json={**SLOW, "max_tokens": 150})

    first = threading.Thread(target=blocker)
    first.start()
    wait_for(lambda: state.stats.num_running == 1)
    with server.http() as http, http.stream("POST", "/v1/completions", json={**SLOW, "stream": True}):
        wait_for(lambda: state.stats.num_waiting == 1)  # headers are in; no token comes while it waits
    wait_for(lambda: not engine.waiting)
    assert first.is_alive()  # gone from the queue long before the slot it waited for came free
    first.join(10)
    assert len(engine.admitted) == 1  # the abandoned request never ran


def test_sigterm_handler_drains_then_stops_the_server() -> None:
    """DrainingServer as `folio serve` runs it, with the signal handler called directly."""
    engine = FakeEngine(step_delay=0.005)
    app = build_app(engine, ServingConfig(served_model_name="fake", model_path="/m", max_model_len=256))
    port = free_port()
    server = DrainingServer(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"), app.state.server, 30
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started)
    url = f"http://127.0.0.1:{port}"
    answer: list[dict] = []
    worker = threading.Thread(
        target=lambda: answer.append(httpx.post(f"{url}/v1/completions", json=SLOW, timeout=30).json())
    )
    worker.start()
    wait_for(lambda: app.state.server.in_flight == 1 and engine.running)
    server.handle_exit(signal.SIGTERM, None)
    wait_for(lambda: httpx.get(f"{url}/ready").status_code == 503)
    assert thread.is_alive()  # still serving the request in flight
    worker.join(30)
    thread.join(30)
    assert not thread.is_alive()
    assert answer[0]["choices"][0]["finish_reason"] == "length"
    assert server.clean_drain is True


def test_second_signal_answers_in_flight_requests_in_the_openai_shape() -> None:
    engine = FakeEngine(step_delay=0.02)  # ~4 s for 200 tokens: still running when the signals come
    app = build_app(engine, ServingConfig(served_model_name="fake", model_path="/m", max_model_len=256))
    port = free_port()
    server = DrainingServer(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5),
        app.state.server,
        30,
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started)
    url = f"http://127.0.0.1:{port}"
    answers: dict[str, httpx.Response] = {}

    def call(name: str, body: dict) -> None:
        answers[name] = httpx.post(f"{url}/v1/completions", json=body, timeout=30)

    workers = [
        threading.Thread(target=call, args=("plain", SLOW)),
        threading.Thread(target=call, args=("stream", {**SLOW, "stream": True})),
    ]
    for w in workers:
        w.start()
    wait_for(lambda: app.state.server.in_flight == 2 and len(engine.running) == 2)
    server.handle_exit(signal.SIGTERM, None)
    server.handle_exit(signal.SIGTERM, None)
    for w in workers:
        w.join(30)
    thread.join(30)
    assert not thread.is_alive()
    plain = answers["plain"]
    assert plain.status_code == 503 and plain.json()["error"]["code"] == "shutting_down"
    events = [ln.removeprefix("data: ") for ln in answers["stream"].text.splitlines() if ln]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "shutting_down"
    assert server.clean_drain is False
