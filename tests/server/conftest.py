"""Servers for the server tests: the app on a fake engine in a thread (fast), and `folio serve`
subprocesses on real models."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from fastapi import FastAPI

from folio.engine.server.admission import Faults
from folio.engine.server.app import build_app
from folio.engine.server.serving import ServingConfig
from tests.server.fake_engine import FakeEngine

MODEL = "fake"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Running:
    url: str
    app: FastAPI
    engine: Any

    def client(self, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, **kwargs)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)


@contextmanager
def serving_fake(
    engine: FakeEngine | None = None, faults: Faults | None = None, **config: Any
) -> Iterator[Running]:
    """The app on ``engine`` (default: a fresh FakeEngine) in a background uvicorn thread."""
    engine = engine or FakeEngine()
    cfg = ServingConfig(
        served_model_name=MODEL,
        model_path="/models/fake",
        max_model_len=engine.model_config.max_model_len,
        **config,
    )
    app = build_app(engine, cfg, faults)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        yield Running(f"http://127.0.0.1:{port}", app, engine)
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def fake_server() -> Iterator[Callable[..., Running]]:
    """Starts servers on fake engines: fake_server(engine=..., faults=..., **ServingConfig fields)."""
    with ExitStack() as stack:
        yield lambda **kwargs: stack.enter_context(serving_fake(**kwargs))


@dataclass
class Serve:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def client(self, **kwargs: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, **kwargs)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_serve(folio_bin: str, model: Path, tmp: Path, *extra: str, timeout: float = 120) -> Serve:
    """Runs `folio serve` on a free loopback port and waits for /health."""
    port = free_port()
    log = tmp / f"serve-{port}.log"
    cmd = [folio_bin, "serve", "--model", str(model), "--port", str(port), "--served-model-name", "m", *extra]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"}
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"folio serve exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return Serve(url, proc, log)
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            stop_serve(Serve(url, proc, log))
            raise AssertionError(f"folio serve did not become healthy:\n{log.read_text()}")
        time.sleep(0.1)


def stop_serve(serve: Serve) -> None:
    if serve.proc.poll() is None:
        serve.proc.send_signal(signal.SIGTERM)
        try:
            serve.proc.wait(30)
        except subprocess.TimeoutExpired:
            serve.proc.kill()
            serve.proc.wait()
