"""Incident safety in `folio up`, for real: a failing canary out on the analysis clock, a killed
replica contained by the router.

The figures these tests print are the ones bench/README.md records (run with ``-s``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from folio.operator import metric_names as m
from folio.operator.analysis.windows import Figures, figures_from_windows, parse_router_metrics
from folio.operator.local.supervisor import free_port
from folio.operator.testing.load import LoadGenerator
from tests.local.test_e2e import FAST_ROLLOUT, NAME, Service, phase, revision_of, router_ready
from tests.support.tools import find_tool
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


@pytest.fixture
def prometheus_binary() -> str:
    return find_tool("prometheus")


class Prometheus:
    """A real Prometheus server on loopback, scraping one router every second."""

    def __init__(self, binary: str, root: Path, target: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = root / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            f"scrape_configs: [{{job_name: router, static_configs: [{{targets: ['{target}']}}]}}]\n"
        )
        self.log = (root / "prometheus.log").open("ab")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={root / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited with {self.proc.returncode}; see {self.log.name}")
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def query(self, promql: str) -> float | None:
        body = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5).json()
        assert body["status"] == "success", body
        result = body["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture
def prometheus(service: Service, prometheus_binary: str) -> Iterator[Prometheus]:
    prom = Prometheus(prometheus_binary, service.root, f"127.0.0.1:{service.port}")
    try:
        wait_for(prom.ready, 60, "Prometheus ready")
        yield prom
    finally:
        prom.stop()


def test_faulty_canary_is_rolled_back_on_promql_figures(service: Service, prometheus: Prometheus) -> None:
    """`analysis.prometheus`: the samples come from a real Prometheus scraping the router `folio up` runs,
    and PromQL's figures are the router's own."""
    rollout: dict[str, Any] = {
        **FAST_ROLLOUT,
        "steps": [{"weight": 50, "pause": "1h"}],
        # windows of 4 scrapes: increase() needs two samples inside its window
        "analysis": {**FAST_ROLLOUT["analysis"], "interval": "4s", "prometheus": {"url": prometheus.url}},
    }
    v1 = service.manifest("v1", rollout=rollout)
    faulty = service.manifest("faulty", {"faultErrorRate": 0.5}, rollout=rollout)
    up = service.up(v1)
    up.wait_for(lambda s: phase(s) == "Ready", 90, "the first revision serving")
    wait_for(lambda: router_ready(up.router_url), 30, "the router serving the first revision")
    wait_for(lambda: prometheus.query('up{job="router"}') == 1.0, 30, "Prometheus scraping the router")
    canary = revision_of(faulty)
    with LoadGenerator(up.router_url, NAME, concurrency=3, max_tokens=4) as load:
        up.client.apply(_yaml(faulty))
        snap = up.wait_for(lambda s: s["status"].get("failedRevisions"), 120, "the rollback on PromQL figures")
    [failed] = snap["status"]["failedRevisions"]
    assert failed["revision"] == canary and failed["reason"] == "AnalysisFailed"
    decided = failed["lastAnalysis"]
    assert decided["verdict"] == "Fail" and decided["requests"] >= 3
    assert not any("baseline" in r or "could not be queried" in r for r in decided["reasons"])  # not a router scrape
    assert "exceeds maxErrorRate" in failed["message"]
    assert load.snapshot().failed == 0

    # The canary takes no traffic any more (once the router has read its new config): its counters stand
    # still. Once Prometheus has scraped them again, PromQL over its series gives what the router's own
    # /metrics give.
    sel = f'{{{m.ISVC}="{NAME}",{m.REVISION}="{canary}"'

    def agreed() -> Figures | None:
        text = httpx.get(f"{up.router_url}/metrics", timeout=5).text
        router = figures_from_windows(parse_router_metrics(text, NAME), canary, None)
        return router if prometheus.query(f"sum({m.REQUESTS}{sel}}})") == router.requests else None

    router = wait_for(agreed, 15, "Prometheus holding the router's final counts", 0.2)
    assert prometheus.query(f'sum({m.REQUESTS}{sel},{m.CODE}=~"5..|error"}})') == router.errors
    for q, metric, mine in ((0.99, m.DURATION, router.latency_p99_ms), (0.95, m.TTFT, router.ttft_p95_ms)):
        promql = prometheus.query(f"histogram_quantile({q}, sum by (le) ({metric}_bucket{sel}}}))")
        assert promql is not None and mine is not None
        assert promql * 1000.0 == pytest.approx(mine, rel=1e-9)
    print(f"Prometheus: canary rolled back on PromQL figures ({decided['requests']} requests, error rate "
          f"{decided['errorRate']:.2%} in the deciding interval); over its life {router.requests:.0f} requests, "
          f"{router.errors:.0f} errors, p99 {router.latency_p99_ms:.1f} ms both ways")
    assert up.stop() == 0


def _yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text())
