"""`folio router` as the local runtime starts it: a subprocess following a config file."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx

from folio.operator import metric_names as m
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
             "--api-keys-file", str(keys), "--log-level", "warning", "--max-request-body-bytes", "4096"],
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
                big = {"model": "m", "prompt": "x" * 5000}
                resp = await client.post("/v1/completions", json=big, headers={"Authorization": "Bearer secret"})
                assert resp.status_code == 413 and resp.json()["error"]["code"] == "body_too_large"
                assert "4096 bytes" in resp.json()["error"]["message"]
                metrics = (await client.get("/metrics")).text
                assert f'{m.REQUESTS}{{adapter="",adapter_revision="",code="200",isvc="chat",revision="r1"}} 1.0' in metrics
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


def test_router_and_engine_share_one_configurable_body_limit() -> None:
    import argparse
    import inspect

    from folio.engine import serve_cli
    from folio.engine.rules import DEFAULT_MAX_REQUEST_BODY_BYTES
    from folio.engine.server.serving import ServingConfig
    from folio.operator.router import cli
    from folio.operator.router.app import RouterApp

    def parsed(add: Callable[[argparse.ArgumentParser], None], *args: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        add(parser)
        return parser.parse_args(list(args))

    engine, router = ["--model", "m"], ["--name", "x", "--config", "c.json"]
    defaults = {
        parsed(serve_cli.add_arguments, *engine).max_request_body_bytes,
        parsed(cli.add_arguments, *router).max_request_body_bytes,
        ServingConfig("m", "/m", 8).max_request_body_bytes,
        inspect.signature(RouterApp).parameters["max_body_bytes"].default,
    }
    assert defaults == {DEFAULT_MAX_REQUEST_BODY_BYTES}
    limit = ["--max-request-body-bytes", "1000"]
    assert parsed(serve_cli.add_arguments, *engine, *limit).max_request_body_bytes == 1000
    assert parsed(cli.add_arguments, *router, *limit).max_request_body_bytes == 1000


def test_a_body_limit_below_one_byte_is_refused(folio_bin: str) -> None:
    run = subprocess.run(
        [folio_bin, "router", "--name", "x", "--config", "c.json", "--max-request-body-bytes", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "--max-request-body-bytes must be >= 1" in run.stderr
