"""`folio router` as the local runtime starts it: a subprocess following a config file."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import httpx

from folio.operator.router import metric_names as m
from tests.router.upstreams import FakeUpstream, free_port, serving, until_ready


async def test_folio_router_serves_a_config_file(folio_bin: str, tmp_path: Path) -> None:
    up = FakeUpstream("r1")
    config, keys = tmp_path / "router.json", tmp_path / "keys"
    keys.write_text("# router keys\nsecret\n")
    port = free_port()
    async with serving(up):
        config.write_text(
            json.dumps({"traffic": [{"revision": "r1", "weight": 100}], "endpoints": {"r1": [up.url]}})
        )
        proc = subprocess.Popen(
            [folio_bin, "router", "--name", "chat", "--port", str(port), "--config", str(config),
             "--api-keys-file", str(keys), "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
                await until_ready(client, proc)
                body = {"model": "m", "prompt": "x"}
                assert (await client.post("/v1/completions", json=body)).status_code == 401
                resp = await client.post(
                    "/v1/completions", json=body, headers={"Authorization": "Bearer secret"}
                )
                assert resp.status_code == 200 and resp.json()["served_by"] == "r1"
                metrics = (await client.get("/metrics")).text
                assert f'{m.REQUESTS}{{code="200",isvc="chat",revision="r1"}} 1.0' in metrics
        finally:
            proc.send_signal(signal.SIGTERM)
            output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, output


def test_bad_arguments_are_refused(folio_bin: str, tmp_path: Path) -> None:
    empty = tmp_path / "keys"
    empty.write_text("\n")
    run = subprocess.run(
        [folio_bin, "router", "--name", "x", "--config", "c.json", "--api-keys-file", str(empty)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "holds no API key" in run.stderr
    run = subprocess.run([folio_bin, "router", "--name", "x"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--config" in run.stderr
