"""The `helm test` Pod's script, run for real against a stand-in router on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.chart import helm as h

REPLY = {"id": "c1", "object": "chat.completion", "model": "smollm2",
         "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"}, "finish_reason": "stop"}]}


class StandIn(ThreadingHTTPServer):
    """Answers POSTs with the queued (status, body) pairs, repeating the last one; records requests."""

    def __init__(self, answers: list[tuple[int, dict]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers = answers
        self.requests: list[tuple[str, dict]] = []


class _Handler(BaseHTTPRequestHandler):
    server: StandIn

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, body))
        status, reply = self.server.answers.pop(0) if len(self.server.answers) > 1 else self.server.answers[0]
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def pod(helm: str) -> h.Obj:
    objects = h.template(helm, {"tests": {"inferenceService": "chat", "model": "smollm2", "timeoutSeconds": 10}})
    return h.one(objects, "Pod")


@pytest.fixture
def stand_in(request: pytest.FixtureRequest) -> Iterator[StandIn]:
    server = StandIn(request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def run_pod(pod: h.Obj, url: str, timeout_s: str | None = None) -> subprocess.CompletedProcess[str]:
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["python", "-c"]
    env = {e["name"]: e["value"] for e in container["env"]}
    env["FOLIO_URL"] = url  # instead of the in-cluster Service DNS name
    if timeout_s is not None:
        env["FOLIO_TIMEOUT"] = timeout_s
    return subprocess.run([sys.executable, "-c", container["args"][0]], env=env, capture_output=True,
                          text=True, timeout=60)


def _url(server: StandIn) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.mark.parametrize("stand_in", [[(200, REPLY)]], indirect=True)
def test_passes_on_a_chat_completion(pod: h.Obj, stand_in: StandIn) -> None:
    proc = run_pod(pod, _url(stand_in))
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout and "Hello!" in proc.stdout
    path, body = stand_in.requests[0]
    assert path == "/v1/chat/completions"
    assert body["model"] == "smollm2" and body["messages"][0]["role"] == "user"


@pytest.mark.parametrize("stand_in", [[(503, {"error": {"message": "warming up"}}), (200, REPLY)]], indirect=True)
def test_waits_out_503_while_replicas_start(pod: h.Obj, stand_in: StandIn) -> None:
    proc = run_pod(pod, _url(stand_in))
    assert proc.returncode == 0, proc.stderr
    assert len(stand_in.requests) == 2


@pytest.mark.parametrize("stand_in", [[(404, {"error": {"message": "model 'smollm2' not found"}})]], indirect=True)
def test_fails_at_once_on_a_client_error(pod: h.Obj, stand_in: StandIn) -> None:
    proc = run_pod(pod, _url(stand_in))
    assert proc.returncode != 0
    assert "HTTP 404" in proc.stderr and "not found" in proc.stderr
    assert len(stand_in.requests) == 1


@pytest.mark.parametrize("stand_in", [[(200, {**REPLY, "choices": [{"index": 0, "finish_reason": "stop",
                                                                     "message": {"role": "assistant", "content": ""}}]})]],
                         indirect=True)
def test_fails_on_an_empty_reply(pod: h.Obj, stand_in: StandIn) -> None:
    proc = run_pod(pod, _url(stand_in))
    assert proc.returncode != 0 and "unexpected reply" in proc.stderr


def test_fails_when_nothing_answers_in_time(pod: h.Obj) -> None:
    proc = run_pod(pod, "http://127.0.0.1:9", timeout_s="0")  # port 9 (discard) refuses connections
    assert proc.returncode != 0 and "ConnectError" in proc.stderr
