"""Two `folio operator` processes with kopf's peering, as the chart runs them with `operator.replicas: 2`.

The one with the higher priority is active, the other waits. SIGKILL the active one mid-canary (it leaves
its heartbeat in the peering object, to expire after `--peering-lifetime`, 10 s by default): the standby
takes over within 15 s and finishes the rollout from status, the rollout's memory, with no step taken
twice, no failed analysis forgotten (the count is in status; the standby's first scrape of the routers is
a baseline, which never resets it), and nothing the clients go through touched during the handover.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import pytest

from folio.operator.controller import cli as controller
from tests.operator.harness import (
    NAMESPACE,
    PEERING,
    ApiServer,
    Background,
    Cluster,
    OperatorProcess,
    declare_peering,
    eventually,
    isvc_manifest,
    operator_processes,
    point_kubeconfig_at_nothing,
    serve_first_revision,
)
from tests.operator.test_clock import SplitLoad, router_pod, serving_load, start_canary, traffic

pytestmark = [pytest.mark.kmock(cls=ApiServer)]

TAKEOVER_S = 15.0  # the bound: from the kill until the standby acts on the canary
# What a handover may write: the InferenceService (status, kopf's annotations), heartbeats, Events.
HANDOVER_WRITES = {"inferenceservices", "kopfpeerings", "events"}


@contextlib.asynccontextmanager
async def active_and_standby(cluster: Cluster, tmp_path: Path) -> AsyncIterator[tuple[OperatorProcess, OperatorProcess]]:
    """Two replicas named in the peering object; the active one (higher priority) has resumed, the standby
    has announced itself and stays paused."""
    declare_peering(cluster.server)
    # named, as the chart passes it: required, so each starts paused; DEBUG logs tell what went wrong
    peering = ["--peering", PEERING, "--verbose"]
    async with operator_processes(cluster.server, tmp_path) as replicas:
        # One after the other: two replicas that start at once may both act until each has seen the other
        # (kopf's peering has no lock); a Deployment's rolling update starts them apart.
        active = replicas.start("operator-a", *peering, "--priority", "200")
        await eventually(lambda: _logged(active, "Resuming operations"), timeout=20, what="the active replica")
        standby = replicas.start("operator-b", *peering, "--priority", "100")

        async def both_heartbeat() -> bool:
            obj = await cluster.call(cluster.kube.call, "GET",
                                     f"/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings/{PEERING}")
            return {"operator-a", "operator-b"} <= set(obj.get("status") or {})

        await eventually(both_heartbeat, timeout=20, what="both replicas in the peering object")
        yield active, standby


async def _logged(p: OperatorProcess, text: str) -> bool:
    assert p.proc.poll() is None, f"{p.name} exited:\n{p.log()[-3000:]}"
    return text in p.log()


@dataclass
class Recorder(Background):
    """Everything status said, polled every 100 ms: the rollout's steps and analysis as the cluster saw them."""

    cluster: Cluster
    seen: list[dict[str, Any]] = field(default_factory=list)

    async def _run(self) -> None:
        while True:
            status = (await self.cluster.isvc()).get("status", {})
            canary = status.get("canary") or {}
            last = canary.get("lastAnalysis") or {}
            entry = {"step": canary.get("step"), "failures": canary.get("consecutiveFailures"),
                     "at": last.get("at"), "verdict": last.get("verdict"), "reasons": last.get("reasons", []),
                     "canary": status.get("canaryRevision"), "time": time.monotonic()}
            if not self.seen or {k: v for k, v in self.seen[-1].items() if k != "time"} != {
                    k: v for k, v in entry.items() if k != "time"}:
                self.seen.append(entry)
            await asyncio.sleep(0.1)


    def first_after(self, t: float) -> dict[str, Any] | None:
        """The first sample recorded after monotonic ``t`` that a fresh replica took (its routers' baseline)."""
        return next((e for e in self.seen if e["time"] > t and any("baseline" in r for r in e["reasons"])), None)


def _writes(cluster: Cluster, since: int) -> list[str]:
    """Writes the emulator got after its ``since``-th request, but for the ones a handover may make."""
    return [f"{r.method} {r.url}" for r in list(cluster.server)[since:]
            if r.method in ("POST", "PATCH", "PUT", "DELETE") and r.resource is not None
            and r.resource.plural not in HANDOVER_WRITES]  # fmt: skip


@dataclass(frozen=True)
class Kill:
    at: float  # monotonic
    requests: int  # how many requests the emulator had had
    standby_log: str  # what the standby had logged by then


def _kill(cluster: Cluster, active: OperatorProcess, standby: OperatorProcess) -> Kill:
    kill = Kill(time.monotonic(), len(list(cluster.server)), standby.log())
    active.kill()
    assert "Resuming operations" not in kill.standby_log, "the standby was active before the kill"
    return kill


async def _events(cluster: Cluster, reason: str) -> list[str]:
    return sorted(e["message"] for e in await cluster.events(reason))


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_the_standby_takes_over_a_canary_and_promotes_it(cluster: Cluster, tmp_path: Path) -> None:
    router = await router_pod(cluster)
    rollout = {"steps": [{"weight": 20, "pause": "5s"}, {"weight": 50, "pause": "2s"}],
               "analysis": {"interval": "1s", "minRequests": 1}, "drainPeriod": "0s"}
    manifest = isvc_manifest(rollout=rollout)
    await cluster.create_isvc(manifest)
    async with active_and_standby(cluster, tmp_path) as (active, standby):
        old = await serve_first_revision(cluster, manifest)
        async with serving_load(router, old):
            new = await start_canary(cluster, rollout)
            async with serving_load(router, new), Recorder(cluster) as recorder:

                async def measured_at_step_1() -> bool:  # step 1 started and a sample passed in it
                    return any(e["step"] == 0 and e["verdict"] == "Pass" for e in recorder.seen)

                await eventually(measured_at_step_1, timeout=20, what="a passing sample at step 1")
                assert await _events(cluster, "CanaryStep")  # posted before the kill: counted below
                kill = _kill(cluster, active, standby)

                async def took_over() -> dict[str, Any] | None:
                    return recorder.first_after(kill.at)

                first = await eventually(took_over, timeout=TAKEOVER_S + 5, what="the standby's first pass")
                takeover = first["time"] - kill.at
                await eventually(lambda: _logged(standby, "Resuming operations"), what="the standby resumed")
                assert _writes(cluster, kill.requests) == [], "the handover touched what serves clients"

                async def promoted() -> bool:
                    return await traffic(cluster) == {new: 100}

                await eventually(promoted, timeout=30, what="the standby promoting the canary")
    print(f"the standby took over {takeover:.1f} s after the active replica was killed")
    assert takeover <= TAKEOVER_S
    steps = [e["step"] for e in recorder.seen if e["step"] is not None]
    assert steps == sorted(steps) and set(steps) == {0, 1}, steps  # forward only, each step once

    async def each_step_once() -> bool:
        assert await _events(cluster, "CanaryStep") == [
            f"canary {new}: step 1/2, 20% of traffic for at least 5s",
            f"canary {new}: step 2/2, 50% of traffic for at least 2s",
        ]
        assert len(await _events(cluster, "Promoted")) == 1
        return True

    await eventually(each_step_once, what="one Event per step and one for the promotion")
    isvc = await cluster.isvc()
    assert isvc["status"]["stableRevision"] == new and not isvc["status"].get("failedRevisions")


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_the_standby_takes_over_a_failing_canary_and_rolls_it_back(cluster: Cluster, tmp_path: Path) -> None:
    """The kill comes after the first failed sample: the standby goes on counting from it (2/3, 3/3)."""
    router = await router_pod(cluster)
    interval, limit = 1.0, 3
    rollout = {"steps": [{"weight": 50, "pause": "1h"}],
               "analysis": {"interval": f"{interval:g}s", "failureLimit": limit, "minRequests": 2}}
    manifest = isvc_manifest(rollout=rollout)
    await cluster.create_isvc(manifest)
    async with active_and_standby(cluster, tmp_path) as (active, standby):
        old = await serve_first_revision(cluster, manifest)
        async with SplitLoad(cluster, router, old, canary_error_rate=0.5) as load, Recorder(cluster) as recorder:
            new = await start_canary(cluster, rollout)

            async def failed_once() -> bool:
                return any(e["failures"] == 1 for e in recorder.seen) and bool(
                    await cluster.events("AnalysisFailed"))

            await eventually(failed_once, timeout=20, what="the first failed sample")
            kill = _kill(cluster, active, standby)

            async def took_over() -> dict[str, Any] | None:
                return recorder.first_after(kill.at)

            first = await eventually(took_over, timeout=TAKEOVER_S + 5, what="the standby's first pass")
            takeover = first["time"] - kill.at
            before = max(e["failures"] or 0 for e in recorder.seen if e["time"] < first["time"])
            assert first["verdict"] == "Inconclusive" and first["failures"] == before >= 1, first  # no reset
            assert _writes(cluster, kill.requests) == [], "the handover touched what serves clients"
            await eventually(load.canary_gone, timeout=20, what="the rollback")
    print(f"the standby took over {takeover:.1f} s after the active replica was killed")
    assert takeover <= TAKEOVER_S
    counts = [e["failures"] for e in recorder.seen if e["failures"] is not None]
    assert counts == sorted(counts) and counts[-1] >= 2, counts  # never reset, never counted twice
    failed = (await cluster.isvc())["status"]["failedRevisions"]
    assert [(f["revision"], f["reason"]) for f in failed] == [(new, "AnalysisFailed")]
    assert f"after {limit} consecutive failed analyses" in failed[0]["message"]

    async def counted() -> bool:  # each failed sample counted once, by whichever replica took it
        messages = await _events(cluster, "AnalysisFailed")
        for n in range(1, limit + 1):
            times = sum(f"failed analysis ({n}/{limit})" in m for m in messages)
            # (one the active replica counted in status just before the kill may have lost its Event)
            assert times == 1 or (times == 0 and 1 < n <= first["failures"]), "\n".join(messages)
        return True

    await eventually(counted, what="one Event per failed sample")


@pytest.mark.parametrize(
    ("argv", "name", "required", "standalone"),
    [
        ([], "folio", False, False),  # kopf's auto mode: peering where its CRD is served, else standalone
        (["--peering", "folio-ha"], "folio-ha", True, False),  # as the chart runs replicas: starts paused
        (["--peering", ""], None, False, True),
    ],
)
def test_peering_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str], name: str | None,
                       required: bool, standalone: bool) -> None:
    point_kubeconfig_at_nothing(tmp_path, monkeypatch)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    captured: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: captured.update(kwargs))
    parser = argparse.ArgumentParser()
    controller.add_arguments(parser)
    assert controller.main(parser.parse_args(["-n", "ml", "--metrics-port", "0", "--health-port", "0", *argv])) == 0
    settings: kopf.OperatorSettings = captured["settings"]
    assert captured["standalone"] is standalone
    if name is not None:
        assert (settings.peering.name, settings.peering.mandatory) == (name, required)
        assert settings.peering.lifetime == controller.PEERING_LIFETIME_S <= TAKEOVER_S - 5
    # a required peering object is looked for at start (`test_a_replica_without_its_peering_object_says_so`)
    startup = [h.fn.__name__ for h in captured["registry"]._activities.get_all_handlers()]
    assert ("check_peering" in startup) is required
    # kopf is handed the view of the served resources that the passes extend (a CRD installed later)
    assert captured["insights"] is captured["memo"].ctx.watches.insights
    assert settings.scanning.disabled  # no cluster-wide CRD or namespace watch: the chart grants neither


@pytest.mark.slow
async def test_a_replica_without_its_peering_object_says_so(cluster: Cluster, tmp_path: Path) -> None:
    """Required peering whose object is missing leaves the replica paused: an error says what to create."""
    declare_peering(cluster.server)  # the CRD and the object "folio", but this replica asks for another
    async with operator_processes(cluster.server, tmp_path) as replicas:
        lost = replicas.start("operator-a", "--peering", "elsewhere")
        line = "peering object /apis/kopf.dev/v1/namespaces/ml/kopfpeerings/elsewhere not found"
        await eventually(lambda: _logged(lost, line), timeout=20, what="the error naming the peering object")
        assert "Resuming operations" not in lost.log()
