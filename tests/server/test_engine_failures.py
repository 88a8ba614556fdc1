"""What the server does when the engine fails: a failing step answers its own requests with a 500 in the
OpenAI shape (counted) while the engine keeps serving; a dead engine loop stops the process non-zero."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import httpx
import pytest
import uvicorn

from folio.engine.config import EngineConfig
from folio.engine.llm_engine import LLMEngine
from folio.engine.server.app import build_app
from folio.engine.server.lifecycle import DrainingServer
from folio.engine.server.serving import ServingConfig
from tests.server.conftest import free_port, serving_fake
from tests.server.fake_engine import FakeEngine
from tests.support.wait import wait_for

BODY = {"model": "fake", "prompt": [1, 17, 42, 99], "max_tokens": 8, "temperature": 0, "ignore_eos": True}


class _FailOnce:
    """The model runner, raising on its next step once armed."""

    def __init__(self, runner) -> None:
        self.runner, self.armed = runner, False

    def step(self, batch):
        if self.armed:
            self.armed = False
            raise RuntimeError("injected step failure")
        return self.runner.step(batch)


@pytest.fixture(scope="module")
def engine(tiny_llama: Path) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=str(tiny_llama), max_model_len=256))
    engine.runner = _FailOnce(engine.runner)
    return engine


def _errors_counted(http: httpx.Client) -> float:
    match = re.search(r'^folio_engine_request_errors_total\{model_name="fake"\} (\S+)$', http.get("/metrics").text, re.M)
    assert match, "folio_engine_request_errors_total is not exported"
    return float(match.group(1))


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_step_answers_500_and_the_engine_keeps_serving(engine: LLMEngine, stream: bool) -> None:
    with serving_fake(engine=engine) as server, server.http() as http:
        before = _errors_counted(http)
        engine.runner.armed = True
        resp = http.post("/v1/completions", json={**BODY, "stream": stream})
        if stream:
            assert resp.status_code == 200  # the stream had started; its last event is the error
            events = [line.removeprefix("data: ") for line in resp.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            error = json.loads(events[-2])["error"]
        else:
            assert resp.status_code == 500
            error = resp.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "internal_error"
        assert "injected step failure" in error["message"]
        assert _errors_counted(http) == before + 1
        assert http.get("/health").status_code == 200
        ok = http.post("/v1/completions", json=BODY)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 8
        assert engine.block_manager.usage == 0.0


def test_a_dead_engine_loop_stops_the_server_with_a_failure() -> None:
    """An engine that cannot step any more must not leave a process that is up but answers 503 forever."""
    engine = FakeEngine(fail_at_step=2, step_delay=0.005)
    app = build_app(engine, ServingConfig(served_model_name="fake", model_path="/m", max_model_len=256))
    port = free_port()
    server = DrainingServer(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"), app.state.server, 30
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started)
    resp = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={**BODY, "prompt": "hi"}, timeout=30)
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "engine_unavailable"
    thread.join(30)
    assert not thread.is_alive() and server.engine_died
