"""`folio up` with `spec.autoscaling` for real: engine processes scale to zero when idle, and a request
that arrives then is held by the router and served by the replica it brought back."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from folio.engine.digest import compute_digest
from folio.operator import metric_names as m
from folio.operator.local.supervisor import free_port
from folio.operator.testing.up import UpProcess, write_manifest
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

AUTOSCALING = {"minReplicas": 0, "maxReplicas": 2, "metric": "InFlight", "target": 1,
               "scaleDownDelay": "2s", "holdTimeout": "120s", "maxHeldRequests": 16}


def autoscaling(snap: dict[str, Any]) -> dict[str, Any]:
    return snap["status"].get("autoscaling") or {}


def replicas(snap: dict[str, Any]) -> int:
    rev = snap["revision"]
    return int((snap["processes"].get(rev) or {}).get("replicas", 0))


def ready(snap: dict[str, Any]) -> tuple[str, str]:
    cond = next(c for c in snap["status"]["conditions"] if c["type"] == "Ready")
    return cond["status"], cond["reason"]


def router_counter(url: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_scale_to_zero_and_back_on_a_held_request(tmp_path: Path, tiny_llama: Path) -> None:
    manifest = write_manifest(
        tmp_path / "auto.yaml", name="tiny", model=tiny_llama, digest=compute_digest(tiny_llama),
        args={"device": "cpu", "maxNumSeqs": 8}, autoscaling=AUTOSCALING,
    )  # fmt: skip
    up = UpProcess(manifest, port=free_port(), state_dir=tmp_path / ".folio", log=tmp_path / "up.log")
    try:
        up.wait_for(lambda s: s["status"].get("phase") == "Ready", 120, "the first revision serving")
        # idle for scaleDownDelay: no engine process is left, and the service still reads Ready
        snap = up.wait_for(lambda s: autoscaling(s).get("desiredReplicas") == 0 and replicas(s) == 0
                           and ready(s) == ("True", "ScaledToZero"), 60, "scaled to zero, and Ready says so")
        assert not up.client.status()["processes"][snap["revision"]]["pids"]
        assert httpx.get(f"{up.router_url}/ready", timeout=5).status_code == 200

        started = time.monotonic()
        resp = httpx.post(f"{up.router_url}/v1/completions", timeout=120,
                          json={"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0})
        cold_start = time.monotonic() - started
        assert resp.status_code == 200, resp.text
        assert resp.json()["usage"]["completion_tokens"] == 4
        assert router_counter(up.router_url, m.HELD_TOTAL, outcome="served") == 1
        snap = up.status()
        assert autoscaling(snap)["desiredReplicas"] >= 1 and replicas(snap) >= 1
        assert "scaled up" in autoscaling(snap)["reason"] or autoscaling(snap)["lastScaleTime"]
        print(f"cold start from zero: {cold_start:.2f}s")

        # and back to zero once idle again
        up.wait_for(lambda s: replicas(s) == 0, 60, "scaled to zero again")
        wait_for(lambda: router_counter(up.router_url, m.HELD) == 0, 10, "nothing held")
    finally:
        if up.proc.poll() is None:
            up.stop()
