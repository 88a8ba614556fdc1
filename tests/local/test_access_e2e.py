"""`folio up` with spec.access for real: tenants' keys from `--secrets-dir`, their quotas through the router
in front of an engine scheduling by priority, the Secret's problems in status, a key rotated while serving."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from folio.engine.digest import compute_digest
from folio.operator import metric_names as m
from folio.operator.local.supervisor import free_port
from folio.operator.testing.up import UpProcess, write_manifest
from tests.local.test_autoscale_e2e import router_counter
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

ACCESS = {
    "apiKeysSecretRef": {"name": "llm-keys"},
    "tenants": [
        {"name": "search", "priority": "Critical"},
        {"name": "batch", "priority": "Sheddable", "requestsPerMinute": 2, "tokensPerMinute": 100000},
        {"name": "eval"},  # no key in the Secret yet
    ],
}


def degraded(snap: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in snap["status"]["conditions"] if c["type"] == "Degraded")


def write_keys(root: Path, **keys: str) -> None:
    folder = root / "llm-keys"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    for tenant, value in keys.items():
        (folder / tenant).write_text(value)


def cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return []


def test_tenants_keys_quotas_and_rotation_through_folio_up(tmp_path: Path, tiny_llama: Path) -> None:
    state = tmp_path / ".folio"
    secrets = state / "secrets"  # the default --secrets-dir
    write_keys(secrets, search="sk-search\n", batch="sk-batch\n")
    manifest = write_manifest(
        tmp_path / "access.yaml", name="tiny", model=tiny_llama, digest=compute_digest(tiny_llama),
        args={"device": "cpu", "maxNumSeqs": 8}, access=ACCESS,
    )  # fmt: skip
    up = UpProcess(manifest, port=free_port(), state_dir=state, log=tmp_path / "up.log")

    def complete(key: str | None, **body: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.post(f"{up.router_url}/v1/completions", headers=headers, timeout=60,
                          json={"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0, **body})  # fmt: skip

    try:
        snap = up.wait_for(lambda s: s["status"].get("phase") == "Ready", 120, "the first revision serving")
        snap = up.wait_for(
            lambda s: degraded(s)["reason"] == "InvalidAccess", 30, "the keyless tenant reported"
        )
        assert "tenant 'eval' has no API key" in degraded(snap)["message"]
        # tenants of several priorities: the engines schedule by priority, and the router queues past their slots
        engines = [argv for argv in map(cmdline, up.child_pids()) if "serve" in argv]
        assert engines and all("--scheduling-policy" in argv and "priority" in argv for argv in engines)
        assert json.loads((state / "router.json").read_text())["access"]["slots"] == 8

        assert complete(None).status_code == 401 and complete("sk-nobody").status_code == 401
        served = complete("sk-search")  # Critical: priority -1 on an engine scheduling by priority
        assert served.status_code == 200, served.text
        assert served.json()["usage"]["completion_tokens"] == 4
        first = complete("sk-batch")
        assert first.status_code == 200 and first.headers["x-ratelimit-remaining-requests"] == "1"
        assert complete("sk-batch").status_code == 200
        over = complete("sk-batch")
        assert over.status_code == 429 and int(over.headers["Retry-After"]) >= 1
        assert router_counter(up.router_url, m.TENANT_REQUESTS, tenant="batch", code="429") == 1
        assert router_counter(up.router_url, m.TENANT_TOKENS, tenant="search", kind="completion") == 4
        assert router_counter(up.router_url, m.REQUESTS, code="401") == 0  # never a revision's

        # rotation: a second key, then the first removed; and the missing tenant's key arrives
        write_keys(secrets, search="sk-search\nsk-search-2\n", batch="sk-batch\n", eval="sk-eval")
        wait_for(lambda: complete("sk-search-2").status_code == 200, 10, "the new key accepted")
        write_keys(secrets, search="sk-search-2\n", batch="sk-batch\n", eval="sk-eval")
        wait_for(lambda: complete("sk-search").status_code == 401, 10, "the old key refused")
        assert complete("sk-eval").status_code == 200
        up.wait_for(
            lambda s: degraded(s)["status"] == "False", 30, "Degraded cleared once every tenant has a key"
        )

        # `folio status NAME --tenants`: the last minute's and hour's usage, from the router
        shown = subprocess.run([sys.executable, "-m", "folio.operator.cli", "status", "tiny", "--tenants", "-o", "json",
                                "--state-dir", str(state)], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        usage = json.loads(shown.stdout)
        assert usage["batch"]["minute"]["requests"] == 3 and usage["batch"]["minute"]["rate_limited"] == 1
        assert usage["search"]["hour"]["completion_tokens"] >= 4 and usage["eval"]["hour"]["requests"] == 1
        table = subprocess.run([sys.executable, "-m", "folio.operator.cli", "status", "--tenants",
                                "--state-dir", str(state)], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert table.returncode == 0 and "batch" in table.stdout and "1 router" in table.stdout, table.stderr
    finally:
        if up.proc.poll() is None:
            up.stop()
