"""Incident safety in `folio up`, for real: a failing canary out on the analysis clock, a killed
replica contained by the router.

The figures these tests print are the ones bench/README.md records (run with ``-s``).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from folio.operator.router import metric_names as m
from folio.operator.testing.load import LoadGenerator
from tests.local.test_e2e import FAST_ROLLOUT, NAME, Service, phase, revision_of, router_ready
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def service(tmp_path: Path, tiny_llama: Path):
    svc = Service(tmp_path, tiny_llama)
    yield svc
    svc.close()


def router_metric(router_url: str, name: str, **labels: str) -> float:
    """The sum of the router's samples of ``name`` whose labels include ``labels``."""
    text = httpx.get(f"{router_url}/metrics", timeout=5).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


def test_failing_canary_is_rolled_back_on_the_analysis_clock(service: Service) -> None:
    """Rolled back within failureLimit × interval + 2 s of taking traffic; clients see no error."""
    interval, failure_limit = 2.0, 2
    rollout: dict[str, Any] = {
        **FAST_ROLLOUT,
        "steps": [{"weight": 50, "pause": "1h"}],
        "analysis": {**FAST_ROLLOUT["analysis"], "interval": f"{interval:g}s", "failureLimit": failure_limit},
    }
    v1 = service.manifest("v1", rollout=rollout)
    faulty = service.manifest("faulty", {"faultErrorRate": 0.5}, rollout=rollout)
    up = service.up(v1)
    up.wait_for(lambda s: phase(s) == "Ready", 90, "the first revision serving")
    wait_for(lambda: router_ready(up.router_url), 30, "the router serving the first revision")
    with LoadGenerator(up.router_url, NAME, concurrency=3, max_tokens=4) as load:
        up.client.apply(_yaml(faulty))
        took_traffic = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # status polled 20 times a second: both moments to ~50 ms
            status = up.status()["status"]
            now = time.monotonic()
            if status.get("failedRevisions"):
                break
            if took_traffic is None and (status.get("canary") or {}).get("weight"):
                took_traffic = now
            time.sleep(0.05)
        else:
            pytest.fail(f"no rollback within 120 s; last status {status}")
    assert took_traffic is not None, "the canary never took traffic"
    elapsed = now - took_traffic
    [failed] = status["failedRevisions"]
    assert failed["revision"] == revision_of(faulty) and failed["reason"] == "AnalysisFailed"
    stats = load.snapshot()
    print(f"folio up: rolled back {elapsed:.2f} s after the canary took traffic (interval {interval:g}s, "
          f"failureLimit {failure_limit}); {stats.ok} client requests, {stats.failed} failed")
    assert elapsed <= failure_limit * interval + 2.0
    assert stats.failed == 0, stats.errors[:5]  # the canary's failures were retried on stable
    assert up.stop() == 0


def test_killed_stable_replica_is_ejected_without_client_errors_and_readmitted(service: Service) -> None:
    # One failure ejects, so that the replica is ejected whichever way its death shows first (requests in
    # flight cut off, or the next connection refused); the supervisor's probe would take it out anyway.
    router = {"outlierDetection": {"consecutiveErrors": 1, "baseEjectionTime": "1s"}}
    up = service.up(service.manifest("v1", replicas=2, router=router))
    rev = revision_of(service.root / "v1.yaml")
    snap = up.wait_for(lambda s: phase(s) == "Ready" and s["processes"][rev]["ready"] == 2, 90, "two ready replicas")
    wait_for(lambda: router_ready(up.router_url), 30, "the router serving")
    processes = snap["processes"][rev]
    victim_pid, victim_url = processes["pids"][0], processes["endpoints"][0]
    with LoadGenerator(up.router_url, NAME, concurrency=3, max_tokens=4) as load:
        wait_for(lambda: load.snapshot().ok >= 10, 30, "the load flowing")
        os.kill(victim_pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: router_metric(up.router_url, m.EJECTIONS, replica=victim_url) >= 1, 10,
                 "the killed replica ejected")  # fmt: skip
        ejected_after = time.monotonic() - killed
        up.wait_for(lambda s: s["processes"][rev]["restarts"] == 1 and s["processes"][rev]["ready"] == 2, 60,
                    "the replica restarted and ready")  # fmt: skip
        restarted_after = time.monotonic() - killed

        def serving_again() -> bool:  # the new process's own count of the requests it answered
            text = httpx.get(f"{victim_url}/metrics", timeout=5).text
            return router_ready(up.router_url) and any(
                s.name == "vllm:request_success_total" and s.value > 0
                for family in text_string_to_metric_families(text) for s in family.samples
            )  # fmt: skip

        wait_for(serving_again, 30, "the restarted replica serving requests again")
        readmitted_after = time.monotonic() - killed
    stats = load.snapshot()
    print(f"folio up: killed replica ejected {ejected_after:.2f} s after kill -9, restarted and ready after "
          f"{restarted_after:.1f} s, serving again after {readmitted_after:.1f} s; {stats.ok} client requests, "
          f"{stats.failed} failed")
    assert stats.failed == 0, stats.errors[:5]
    assert router_metric(up.router_url, m.EJECTED, replica=victim_url) == 0
    assert up.stop() == 0


def _yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text())
