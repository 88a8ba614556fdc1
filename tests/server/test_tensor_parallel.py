"""`folio serve --tensor-parallel-size 2` on the CPU: it serves, exports its collectives' times, and a
rank that dies or stalls takes the whole replica down (readiness off, exit non-zero within 30 s, a clear
log line) instead of hanging."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.server.conftest import Serve, start_serve, stop_serve
from tests.support.wait import wait_for

DOWN_WITHIN_S = 30


def _worker(serve: Serve) -> psutil.Process:
    """Rank 1: the spawned child of `folio serve` (not multiprocessing's resource tracker)."""
    children = [
        c for c in psutil.Process(serve.proc.pid).children()
        if "resource_tracker" not in " ".join(c.cmdline())
    ]  # fmt: skip
    assert len(children) == 1, [c.cmdline() for c in children]
    return children[0]


def _collective_count(serve: Serve, op: str) -> float:
    text = httpx.get(f"{serve.url}/metrics", timeout=5).text
    match = re.search(rf'folio_engine_collective_seconds_count\{{model_name="m",op="{op}"\}} (\S+)', text)
    return float(match.group(1)) if match else 0.0


def test_killing_a_rank_takes_the_server_down(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> None:
    serve = start_serve(folio_bin, tiny_llama, tmp_path, "--tensor-parallel-size", "2", "--kv-cache-memory-gib", "0.02")
    try:
        reply = httpx.post(
            f"{serve.url}/v1/completions", json={"model": "m", "prompt": "Paris is", "max_tokens": 4}, timeout=60
        )
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] == 4
        assert _collective_count(serve, "all_reduce") > 0 and _collective_count(serve, "gather") > 0
        wait_for(lambda: _collective_count(serve, "probe") > 0, timeout=20, what="a collectives health probe")
        worker = _worker(serve)
        worker.kill()
        killed = time.monotonic()
        code = serve.proc.wait(DOWN_WITHIN_S)
        assert time.monotonic() - killed < DOWN_WITHIN_S
        assert code != 0
        log = serve.output()
        assert f"tensor-parallel rank 1 (pid {worker.pid}) exited with code -9; taking this engine replica down" in log
    finally:
        stop_serve(serve)


@pytest.mark.slow
def test_a_stalled_rank_fails_requests_in_flight_and_the_server(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> None:
    serve = start_serve(
        folio_bin, tiny_llama, tmp_path, "--tensor-parallel-size", "2", "--kv-cache-memory-gib", "0.02",
        "--collective-timeout", "3",
    )  # fmt: skip
    worker = _worker(serve)
    answers: list[httpx.Response | Exception] = []

    def request() -> None:
        try:
            body = {"model": "m", "prompt": "Paris is", "max_tokens": 200, "ignore_eos": True}
            answers.append(httpx.post(f"{serve.url}/v1/completions", json=body, timeout=60))
        except Exception as exc:
            answers.append(exc)

    try:
        os.kill(worker.pid, signal.SIGSTOP)  # alive but stuck: only the watchdog can tell
        stopped = time.monotonic()
        thread = threading.Thread(target=request)
        thread.start()
        code = serve.proc.wait(DOWN_WITHIN_S)
        assert time.monotonic() - stopped < DOWN_WITHIN_S and code != 0
        thread.join(10)
        assert answers and isinstance(answers[0], httpx.Response) and answers[0].status_code >= 500, answers
        assert "(collective timeout 3s): a rank is stuck or gone; taking this engine replica down" in serve.output()
        assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE
    finally:
        if worker.is_running():
            worker.kill()
        stop_serve(serve)
