"""`folio up` for real: engine processes with a tiny model, the real router, the rollout state machine.

Short intervals keep each rollout to seconds: analysis every second, a handful of requests per
sample, two-second steps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from folio.engine.digest import compute_digest
from folio.operator.local.supervisor import free_port
from folio.operator.spec import InferenceService, revision_name
from folio.operator.testing.load import LoadGenerator
from folio.operator.testing.up import UpProcess, wait_gone, write_manifest

pytestmark = pytest.mark.slow

NAME = "tiny"
FAST_ROLLOUT = {
    "steps": [{"weight": 20, "pause": "2s"}, {"weight": 50, "pause": "2s"}],
    "analysis": {
        "interval": "1s",
        "minRequests": 3,
        "failureLimit": 2,
        "maxErrorRate": 0.05,
        # CPU engines sharing two cores: latency differences are noise here, errors are the signal
        "maxLatencyP99IncreaseMs": 10000,
        "maxTimeToFirstTokenP95Ms": 30000,
    },
    "drainPeriod": "1s",
}


class Service:
    """Manifests for one tiny-model service in a temp folder, and `folio up` runs of them."""

    def __init__(self, root: Path, model: Path) -> None:
        self.root, self.model = root, model
        self.digest = compute_digest(model)
        self.state_dir = root / ".folio"
        self.port = free_port()
        self.runs: list[UpProcess] = []

    def manifest(self, tag: str, args: dict[str, Any] | None = None, **kwargs: Any) -> Path:
        kwargs.setdefault("rollout", FAST_ROLLOUT)
        return write_manifest(
            self.root / f"{tag}.yaml", name=NAME, model=self.model, digest=self.digest,
            args={"device": "cpu", "maxNumSeqs": 8, **(args or {})}, **kwargs,
        )  # fmt: skip

    def up(self, manifest: Path) -> UpProcess:
        run = UpProcess(manifest, port=self.port, state_dir=self.state_dir, log=self.root / "up.log")
        self.runs.append(run)
        return run

    def close(self) -> None:
        for run in self.runs:
            if run.proc.poll() is None:
                run.stop()


@pytest.fixture
def service(tmp_path: Path, tiny_llama: Path):
    svc = Service(tmp_path, tiny_llama)
    yield svc
    svc.close()


def revision_of(manifest: Path) -> str:
    return revision_name(InferenceService.model_validate(yaml.safe_load(manifest.read_text())).spec)


def phase(snap: dict[str, Any]) -> str | None:
    return snap["status"].get("phase")


def folio(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "folio.operator.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_faulty_canary_rolls_back_healthy_one_is_promoted(service: Service) -> None:
    v1, faulty = service.manifest("v1"), service.manifest("faulty", {"faultErrorRate": 0.5})
    healthy = service.manifest("healthy", {"maxNumSeqs": 16})
    up = service.up(v1)
    up.wait_for(lambda s: phase(s) == "Ready", 90, "the first revision serving")
    # the router confirms the config a status gives before that status is saved: Ready means it serves now
    assert router_ready(up.router_url)

    client = openai.OpenAI(base_url=f"{up.router_url}/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert reply.choices[0].message.content and reply.usage and reply.usage.completion_tokens == 4

    with LoadGenerator(up.router_url, NAME, concurrency=3, max_tokens=4) as load:
        assert (
            folio("apply", str(faulty), "--state-dir", str(service.state_dir), cwd=service.root).returncode
            == 0
        )
        snap = up.wait_for(lambda s: s["status"].get("failedRevisions"), 120, "the automatic rollback")
        status = snap["status"]
        [failed] = status["failedRevisions"]
        assert failed["revision"] == revision_of(faulty) and failed["reason"] == "AnalysisFailed"
        assert "error rate" in failed["message"]
        assert status["traffic"] == [{"revision": revision_of(v1), "weight": 100}]
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert degraded["status"] == "True" and "exceeds maxErrorRate" in degraded["message"]

        assert (
            folio("apply", str(healthy), "--state-dir", str(service.state_dir), cwd=service.root).returncode
            == 0
        )
        weights_seen: set[int] = set()
        poisoned: list[int] = []

        def promoted(s: dict[str, Any]) -> bool:
            canary = s["status"].get("canary") or {}
            weights_seen.add(canary.get("weight", 0))
            if canary.get("weight") and not poisoned:  # both revisions take traffic now
                poisoned.extend(send_poison(up.router_url, 8))
            return phase(s) == "Promoted"

        snap = up.wait_for(promoted, 120, "the promotion")
        time.sleep(1)  # a last second of load on the new stable
    stats = load.snapshot()
    assert stats.failed == 0, stats.errors[:5]  # the poison took no engine down
    assert stats.ok > 20
    assert poisoned == [400] * 8
    assert {20, 50} <= weights_seen
    assert snap["status"]["stableRevision"] == revision_of(healthy)
    assert snap["status"]["traffic"] == [{"revision": revision_of(healthy), "weight": 100}]

    out = folio("status", "-o", "json", "--state-dir", str(service.state_dir), cwd=service.root)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["stableRevision"] == revision_of(healthy)
    assert up.stop() == 0  # raises if any process was left behind


# The request of the hardening report that used to kill an engine's step loop for good.
POISON = {"model": NAME, "prompt": "hi", "max_tokens": 2, "top_k": 2**63}


def router_ready(router_url: str) -> bool:
    try:
        return httpx.get(f"{router_url}/ready", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def send_poison(router_url: str, times: int) -> list[int]:
    return [httpx.post(f"{router_url}/v1/completions", json=POISON, timeout=30).status_code for _ in range(times)]


def test_killed_engine_is_restarted_and_counted(service: Service) -> None:
    up = service.up(service.manifest("v1", replicas=2))
    snap = up.wait_for(lambda s: phase(s) == "Ready" and s["processes"][revision_of(service.root / "v1.yaml")]["ready"] == 2,
                       90, "two ready replicas")  # fmt: skip
    rev = revision_of(service.root / "v1.yaml")
    victim = snap["processes"][rev]["pids"][0]
    with LoadGenerator(up.router_url, NAME, concurrency=2, max_tokens=4) as load:
        time.sleep(1)
        os.kill(victim, signal.SIGKILL)
        snap = up.wait_for(lambda s: s["processes"][rev]["restarts"] == 1, 30, "the restart being counted")
        snap = up.wait_for(lambda s: s["processes"][rev]["ready"] == 2, 60, "the replica back")
        before = load.snapshot().ok
        time.sleep(2)
        assert load.snapshot().ok > before  # still serving
    assert victim not in snap["processes"][rev]["pids"]
    assert not snap["processes"][rev]["crashLooping"]
    assert phase(snap) == "Ready"
    assert up.stop(sig=signal.SIGTERM) == 0  # as a service manager stops it


def test_restarted_up_resumes_the_canary(service: Service) -> None:
    slow_steps = {**FAST_ROLLOUT, "steps": [{"weight": 30, "pause": "10m"}]}
    v1 = service.manifest("v1", rollout=slow_steps)
    v2 = service.manifest("v2", {"maxNumSeqs": 16}, rollout=slow_steps)
    up = service.up(v1)
    up.wait_for(lambda s: phase(s) == "Ready", 90, "the first revision serving")
    up.client.apply(yaml.safe_load(v2.read_text()))
    before = up.wait_for(
        lambda s: (s["status"].get("canary") or {}).get("weight") == 30, 90, "the canary step"
    )

    children = up.kill()  # `folio up` crashes; its children must follow it
    assert wait_gone(children, timeout=40) == []

    up2 = service.up(v2)
    snap = up2.wait_for(
        lambda s: (s["status"].get("canary") or {}).get("weight") == 30, 90, "the resumed canary"
    )
    for key in ("stableRevision", "canaryRevision"):
        assert snap["status"][key] == before["status"][key]
    assert snap["status"]["canary"]["stepStartedAt"] == before["status"]["canary"]["stepStartedAt"]

    out = folio("promote", NAME, "--state-dir", str(service.state_dir), cwd=service.root)
    assert out.returncode == 0, out.stderr
    snap = up2.wait_for(lambda s: phase(s) == "Promoted", 30, "the manual promotion")
    assert snap["status"]["stableRevision"] == revision_of(v2)
    assert up2.stop() == 0


def test_crash_looping_canary_fails_without_traffic(service: Service) -> None:
    v1 = service.manifest("v1")
    broken = service.manifest("broken", {"kvCacheMemoryGib": 1e-7})  # the engine refuses to start
    up = service.up(v1)
    up.wait_for(lambda s: phase(s) == "Ready", 90, "the first revision serving")
    up.client.apply(yaml.safe_load(broken.read_text()))
    rev = revision_of(broken)
    traffic_seen: set[str] = set()

    def failed(s: dict[str, Any]) -> bool:
        traffic_seen.update(t["revision"] for t in s["status"].get("traffic", []) if t["weight"] > 0)
        return any(f["revision"] == rev for f in s["status"].get("failedRevisions", []))

    snap = up.wait_for(failed, 120, "the crash-looping canary failing")
    [record] = snap["status"]["failedRevisions"]
    assert record["reason"] == "CrashLoopBackOff"
    assert rev not in traffic_seen
    assert snap["status"]["traffic"] == [{"revision": revision_of(v1), "weight": 100}]
    up.wait_for(lambda s: rev not in s["processes"], 30, "the failed revision's processes stopped")
    log = (service.state_dir / "logs" / f"{rev}-0.log").read_text()
    assert "KV cache budget" in log  # the engine's own reason is kept for the user
    assert up.stop() == 0


def test_weights_that_do_not_match_the_pin_never_serve(service: Service) -> None:
    service.digest = "sha256:" + "0" * 64
    up = service.up(service.manifest("wrong-digest"))
    snap = up.wait_for(lambda s: phase(s) == "Failed", 60, "the revision failing its pre-pull")
    weights = next(c for c in snap["status"]["conditions"] if c["type"] == "WeightsReady")
    assert weights["status"] == "False" and weights["reason"] == "WeightsFailed"
    assert "do not match the pinned digest" in weights["message"]
    assert set(snap["processes"]) == {"router"}  # no engine was started
    assert snap["status"]["traffic"] == []
    assert up.stop() == 0
    # it said why nothing serves, and what it waits for (read once it exited: its output is flushed then)
    said = up.log.read_text()
    assert (f"nothing serves: revision {snap['revision']} failed (WeightsFailed); `folio up` keeps running and "
            "waits for a fixed manifest: `folio apply FILE` (or Ctrl-C to stop)") in " ".join(said.split()), said[-3000:]
