"""The router in front of real `folio serve` replicas (tiny random Llama on the CPU).

A canary that fails every request (`--fault-error-rate 1`) costs the clients nothing: each of its
500s is retried on stable and counted, which is what the rollout analysis then reads.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from folio.operator import metric_names as m
from tests.router.conftest import RouterFactory
from tests.router.upstreams import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engines(folio_bin: str, tiny_llama: Path) -> Iterator[dict[str, str]]:
    """Two replicas of the same model: r1 healthy, r2 answering every request with a 500."""
    procs: dict[str, tuple[subprocess.Popen[str], str]] = {}
    try:
        for rev, extra in (("r1", []), ("r2", ["--fault-error-rate", "1.0"])):
            port = free_port()
            cmd = [folio_bin, "serve", "--model", str(tiny_llama), "--served-model-name", "tiny", "--device", "cpu",
                   "--dtype", "float32", "--port", str(port), "--log-level", "warning", *extra]  # fmt: skip
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            procs[rev] = (proc, f"http://127.0.0.1:{port}")
        for proc, url in procs.values():

            def healthy(proc: subprocess.Popen[str] = proc, url: str = url) -> bool:
                if proc.poll() is not None:
                    pytest.fail(f"folio serve did not start: {proc.communicate()[0][-3000:]}")
                return httpx.get(url + "/health", timeout=1).status_code == 200

            wait_for(healthy, 120, "folio serve healthy", 0.2, ignore=(httpx.TransportError,))
        yield {rev: url for rev, (_, url) in procs.items()}
    finally:
        for proc, _ in procs.values():
            proc.terminate()
        for proc, _ in procs.values():
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


async def test_failing_canary_engine_costs_no_client_errors(
    router: RouterFactory, engines: dict[str, str]
) -> None:
    async with router(
        traffic=[{"revision": "r1", "weight": 50}, {"revision": "r2", "weight": 50}], stable="r1", canary="r2",
        endpoints={"r1": [engines["r1"]], "r2": [engines["r2"]]},
    ) as r:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0}
        answers = await asyncio.gather(*(r.client.post("/v1/completions", json=body) for _ in range(10)))
        assert [a.status_code for a in answers] == [200] * 10
        assert {a.headers["x-folio-revision"] for a in answers} == {"r1"}
        assert all(a.json()["choices"][0]["text"] for a in answers)
        assert r.metric(m.REQUESTS, revision="r2", code="500") == 5
        assert r.metric(m.RETRIES, from_revision="r2", to_revision="r1") == 5
        assert r.metric(m.REQUESTS, revision="r1", code="200") == 10

        chat = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": True,
        }
        events = []
        async with r.client.stream("POST", "/v1/chat/completions", json=chat) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: ") :])
        assert events[-1] == "[DONE]"
        assert all(json.loads(e)["object"] == "chat.completion.chunk" for e in events[:-1])

        models = await r.client.get("/v1/models")
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "tiny"

        bad = await r.client.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": -1})
        assert bad.status_code == 400  # the engine's own validation, relayed as is
        assert "error" in bad.json()
