"""Each InferenceService's clock: a pass when the rollout is due, not at the next resync.

The operator runs with an hour-long resync here, so whatever happens on time happens because a
decision's ``requeue_after`` came due (a drain ending, a step's pause ending, the next analysis
interval) or because a child changed (a Job finishing, a Deployment becoming ready). The service
exists before the operator starts (it is resumed), as after an operator restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from folio.operator.k8s.names import component_labels
from folio.operator.router.metrics import RouterMetrics
from tests.operator.harness import (
    NAMESPACE,
    ApiServer,
    Background,
    Cluster,
    eventually,
    in_background,
    isvc_manifest,
    rev_of,
    running_operator,
    serve_first_revision,
)

pytestmark = [pytest.mark.timeout(90), pytest.mark.kmock(cls=ApiServer)]
HOUR = 3600.0


async def start_canary(cluster: Cluster, rollout: dict[str, Any]) -> str:
    """Apply a new revision and play its pre-pull Job and kubelet until it has a ready replica."""
    await cluster.update_spec("chat", {"engine": {"args": {"maxNumSeqs": 8}}})
    new = rev_of(isvc_manifest(rollout=rollout, engine={"args": {"maxNumSeqs": 8}}))
    await eventually(lambda: cluster.get("batch/v1", "Job", f"chat-prepull-{new}"), what="the canary's pre-pull Job")
    await cluster.set_status("batch/v1", "Job", f"chat-prepull-{new}", {"succeeded": 1})

    async def scaled_up() -> bool:
        dep = await cluster.get("apps/v1", "Deployment", f"chat-{new}")
        return dep is not None and dep["spec"]["replicas"] == 1

    await eventually(scaled_up, what="the canary scaled up once its Job finished (a child event, not a resync)")
    await cluster.set_status("apps/v1", "Deployment", f"chat-{new}", {"readyReplicas": 1, "replicas": 1})
    return new


async def traffic(cluster: Cluster) -> dict[str, int]:
    return {t["revision"]: t["weight"] for t in (await cluster.isvc()).get("status", {}).get("traffic", [])}


async def test_a_drain_ends_when_it_is_due(cluster: Cluster) -> None:
    rollout = {"steps": [{"weight": 50, "pause": "1h"}], "drainPeriod": "2s"}
    await cluster.create_isvc(isvc_manifest(rollout=rollout))
    async with running_operator(cluster.server, resync_s=HOUR):
        old = await serve_first_revision(cluster, isvc_manifest(rollout=rollout))
        new = await start_canary(cluster, rollout)
        await eventually(lambda: _is(traffic(cluster), {old: 50, new: 50}), what="the canary's step")
        await cluster.call(cluster.kube.merge_patch, "serving.folio.dev/v1alpha1", "InferenceService", NAMESPACE,
                           "chat", {"metadata": {"annotations": {"folio.dev/promote": "now"}}})
        await eventually(lambda: _is(traffic(cluster), {new: 100}), what="the promotion")
        promoted = time.monotonic()
        assert await cluster.get("apps/v1", "Deployment", f"chat-{old}") is not None, "the old stable drains first"

        async def old_gone() -> bool:
            return await cluster.get("apps/v1", "Deployment", f"chat-{old}") is None

        await eventually(old_gone, timeout=15, what="the drained revision removed when its drain ended")
        # status timestamps have a resolution of one second, so the drain may end up to 1 s early
        assert time.monotonic() - promoted >= 1.0


async def router_pod(cluster: Cluster) -> RouterMetrics:
    """A router pod whose /metrics (served by the emulator's HTTP server) the test writes."""
    router = RouterMetrics("chat")
    cluster.server["get /metrics"] << (lambda: router.render())
    port = cluster.server.url.port
    await cluster.call(cluster.kube.create, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "chat-router-1", "namespace": NAMESPACE, "labels": component_labels("chat", "router")},
        "spec": {"containers": [{"name": "router", "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    })  # fmt: skip
    return router


async def test_canary_steps_end_when_their_pause_ends(cluster: Cluster) -> None:
    """Steps of 2 s with analysis every second: promoted in seconds, although nothing resyncs for an hour."""
    router = await router_pod(cluster)
    rollout = {"steps": [{"weight": 10, "pause": "2s"}, {"weight": 50, "pause": "2s"}],
               "analysis": {"interval": "1s", "minRequests": 1}, "drainPeriod": "0s"}
    seen: set[int] = set()
    await cluster.create_isvc(isvc_manifest(rollout=rollout))
    async with running_operator(cluster.server, resync_s=HOUR):
        old = await serve_first_revision(cluster, isvc_manifest(rollout=rollout))
        async with serving_load(router, old):
            new = await start_canary(cluster, rollout)
            async with serving_load(router, new):
                started = time.monotonic()

                async def promoted() -> bool:
                    weights = await traffic(cluster)
                    seen.add(weights.get(new, 0))
                    return weights == {new: 100}

                await eventually(promoted, timeout=30, what="the canary walking both steps")
    assert {10, 50, 100} <= seen
    assert time.monotonic() - started >= 4.0 - 2.0  # two pauses of 2 s (timestamps: 1 s resolution each)


async def test_a_failing_canary_is_rolled_back_on_the_analysis_clock(cluster: Cluster) -> None:
    """Rolled back within failureLimit × interval + 2 s of taking traffic: samples come at the interval
    from when the canary took traffic, not at the resync (an hour here)."""
    router = await router_pod(cluster)
    interval, failure_limit = 2.0, 2
    rollout = {"steps": [{"weight": 50, "pause": "1h"}],
               "analysis": {"interval": f"{interval:g}s", "failureLimit": failure_limit, "minRequests": 5}}
    await cluster.create_isvc(isvc_manifest(rollout=rollout))
    async with running_operator(cluster.server, resync_s=HOUR):
        old = await serve_first_revision(cluster, isvc_manifest(rollout=rollout))
        async with SplitLoad(cluster, router, old, canary_error_rate=0.5) as load:
            new = await start_canary(cluster, rollout)
            await eventually(lambda: load.canary_served(), timeout=15, what="the canary taking traffic")
            await eventually(lambda: load.canary_gone(), timeout=30, what="the rollback")
        [failed] = (await cluster.isvc())["status"]["failedRevisions"]
    assert failed["revision"] == new and failed["reason"] == "AnalysisFailed"
    elapsed = load.canary_seconds()
    print(f"rolled back {elapsed:.2f} s after the canary took traffic (interval {interval:g}s, "
          f"failureLimit {failure_limit}: due at {failure_limit * interval:g} s)")
    assert elapsed <= failure_limit * interval + 2.0


class SplitLoad(Background):
    """What the router pod reports while it follows status.traffic: 20 requests a second, split by
    the weights it last read, the canary failing ``canary_error_rate`` of its own."""

    TICK_S = 0.05

    def __init__(self, cluster: Cluster, router: RouterMetrics, stable: str, *, canary_error_rate: float) -> None:
        self.cluster, self.router, self.stable, self.error_rate = cluster, router, stable, canary_error_rate
        self.first_canary: float | None = None  # monotonic: when the router first sent the canary traffic
        self.last_canary: float | None = None  # ...and when it last did, before it stopped
        self.stopped = False

    async def _run(self) -> None:
        sent = {"stable": 0.0, "canary": 0.0}
        failures = 0.0
        while True:
            weights = await traffic(self.cluster)
            canary = next((rev for rev, w in weights.items() if rev != self.stable and w > 0), None)
            now = time.monotonic()
            if canary is not None:
                self.first_canary = self.first_canary or now
                self.last_canary = now
            elif self.first_canary is not None:
                self.stopped = True
            share = weights.get(canary, 0) / 100 if canary else 0.0
            for rev, part in ((self.stable, 1.0 - share), (canary, share)):
                if rev is None:
                    continue
                key = "stable" if rev == self.stable else "canary"
                sent[key] += part
                while sent[key] >= 1.0:  # whole requests, in the weights' proportion
                    sent[key] -= 1.0
                    code = "200"
                    if key == "canary":
                        failures += self.error_rate
                        if failures >= 1.0:
                            failures, code = failures - 1.0, "500"
                    self.router.attempt_started(rev)
                    self.router.attempt_finished(rev, code, 0.01)
                    self.router.first_byte(rev, 0.005)
            await asyncio.sleep(self.TICK_S)

    async def canary_served(self) -> bool:
        return self.first_canary is not None

    async def canary_gone(self) -> bool:
        return self.stopped

    def canary_seconds(self) -> float:
        assert self.first_canary is not None and self.last_canary is not None and self.stopped
        return self.last_canary - self.first_canary



@contextlib.asynccontextmanager
async def serving_load(router: RouterMetrics, revision: str) -> AsyncIterator[None]:
    """What the router pod reports: successful, quick answers from ``revision``, ten a second."""

    async def serve() -> None:
        while True:
            router.attempt_started(revision)
            router.attempt_finished(revision, "200", 0.01)
            router.first_byte(revision, 0.005)
            await asyncio.sleep(0.1)

    async with in_background(serve):
        yield


async def _is(weights: Any, expected: dict[str, int]) -> bool:
    return await weights == expected
