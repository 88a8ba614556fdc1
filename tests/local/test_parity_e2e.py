"""The parity gate end to end in `folio up` on a tiny model: a `faultLogitNoise` canary (which fails no
request) is rolled back before any traffic reaches it; a suite that cannot run keeps the canary waiting
with Degraded=True while stable serves; a canary with the same weights passes and takes its steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from folio.operator.testing.wait import wait_for
from tests.local.test_e2e import FAST_ROLLOUT, Service, folio, phase, revision_of, router_ready

pytestmark = pytest.mark.slow

GATE = {"prompts": 12, "maxTokens": 6, "minCosine": 0.9985, "minTokenMatch": 0.9}


def gated(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {**FAST_ROLLOUT, "parity": {**GATE, **(extra or {})}}


@pytest.fixture
def service(tmp_path: Path, tiny_llama: Path):
    svc = Service(tmp_path, tiny_llama)
    yield svc
    svc.close()


def canary_traffic(s: dict[str, Any], rev: str) -> int:
    return sum(t["weight"] for t in s["status"].get("traffic", []) if t["revision"] == rev)


def test_noisy_canary_is_stopped_by_the_gate_and_a_faithful_one_passes(service: Service) -> None:
    v1 = service.manifest("v1", rollout=gated())
    noisy = service.manifest("noisy", {"faultLogitNoise": 4.0}, rollout=gated())
    same = service.manifest("same", {"maxNumSeqs": 16}, rollout=gated())
    up = service.up(v1)
    up.wait_for(lambda s: phase(s) == "Ready", 90, "the first revision serving")
    wait_for(lambda: router_ready(up.router_url), 30, "the router serving")

    assert folio("apply", str(noisy), "--state-dir", str(service.state_dir), cwd=service.root).returncode == 0
    rev = revision_of(noisy)
    seen: list[int] = []

    def rolled_back(s: dict[str, Any]) -> bool:
        seen.append(canary_traffic(s, rev))
        return any(f["revision"] == rev for f in s["status"].get("failedRevisions", []))

    snap = up.wait_for(rolled_back, 180, "the parity gate failing the noisy canary")
    assert set(seen) == {0}, "no user request reached the canary"
    [failed] = snap["status"]["failedRevisions"]
    assert failed["reason"] == "ParityFailed"
    report = failed["parity"]
    assert report["verdict"] == "Fail" and report["prompts"] == GATE["prompts"]
    assert report["meanCosine"] < GATE["minCosine"] and report["worst"]
    degraded = next(c for c in snap["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ParityFailed" and "mean cosine" in degraded["message"]

    out = folio("status", "tiny", "--parity", "--state-dir", str(service.state_dir), cwd=service.root)
    assert out.returncode == 0, out.stderr
    assert "Fail" in out.stdout and "worst prompts" in out.stdout and rev in out.stdout
    as_json = folio("status", "--parity", "-o", "json", "--state-dir", str(service.state_dir), cwd=service.root)
    assert json.loads(as_json.stdout)["revision"] == rev

    assert folio("apply", str(same), "--state-dir", str(service.state_dir), cwd=service.root).returncode == 0
    good = revision_of(same)
    snap = up.wait_for(lambda s: canary_traffic(s, good) > 0 or phase(s) == "Promoted", 180, "the gate passing")
    canary = snap["status"].get("canary") or {}
    parity = canary.get("parity") or {}
    assert parity.get("verdict") == "Pass" and parity["meanCosine"] > 0.99999 and parity["tokenMatch"] == 1.0
    assert canary["weight"] == FAST_ROLLOUT["steps"][0]["weight"]  # step 1 began once the gate passed
    assert up.stop() == 0


def test_a_suite_that_cannot_run_is_degraded_and_stable_keeps_serving(service: Service) -> None:
    suite = service.root / "suite.jsonl"
    suite.write_text('{"prompt": "Hello"}\n{not json\n')
    v1 = service.manifest("v1", rollout=gated({"suiteFile": str(suite)}))
    v2 = service.manifest("v2", {"maxNumSeqs": 16}, rollout=gated({"suiteFile": str(suite)}))
    up = service.up(v1)
    up.wait_for(lambda s: phase(s) == "Ready", 90, "the first revision serving")
    up.client.apply(yaml.safe_load(v2.read_text()))
    rev = revision_of(v2)

    def degraded(s: dict[str, Any]) -> bool:
        c = next((c for c in s["status"].get("conditions", []) if c["type"] == "Degraded"), {})
        return c.get("reason") == "ParityGateError"

    snap = up.wait_for(degraded, 120, "Degraded=True for the unusable suite")
    c = next(c for c in snap["status"]["conditions"] if c["type"] == "Degraded")
    assert "line 2: not JSON" in c["message"]
    assert snap["status"]["traffic"] == [{"revision": revision_of(v1), "weight": 100}]
    assert not snap["status"].get("failedRevisions")
    ready = next(c for c in snap["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"

    suite.write_text('{"prompt": "Hello"}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    snap = up.wait_for(lambda s: canary_traffic(s, rev) > 0 or phase(s) == "Promoted", 120,
                       "the gate passing once the suite is fixed (retried)")
    assert up.stop() == 0
