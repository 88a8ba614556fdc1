"""Low-traffic canaries through the real operator: a growing analysis window, and maxInconclusiveDuration.

The reported case: a service at ~0.3 requests a second with ``minRequests: 4`` and ``interval: 3s`` sat at
its 25% step for ever, every interval Inconclusive. Here (at test pace: a canary request every 1.2 s,
``interval: 1s``, ``minRequests: 3``) no interval ever has minRequests, and the canary is promoted all the
same, judged on the requests each step accumulated. A canary that gets no request at all is paused after
``maxInconclusiveDuration`` and waits for someone: ``retry`` analyses the step afresh, ``promote``
promotes it. The operator resyncs once an hour: every step here is on the rollout's own clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from folio.operator.router.metrics import RouterMetrics
from tests.operator.harness import (
    NAMESPACE,
    ApiServer,
    Cluster,
    condition,
    eventually,
    in_background,
    isvc_manifest,
    running_operator,
    serve_first_revision,
)
from tests.operator.test_clock import router_pod, serving_load, start_canary, traffic

pytestmark = [pytest.mark.timeout(60), pytest.mark.kmock(cls=ApiServer)]
HOUR = 3600.0


@contextlib.asynccontextmanager
async def trickle(router: RouterMetrics, revision: str, every_s: float) -> AsyncIterator[None]:
    """One successful request to ``revision`` every ``every_s`` seconds, whatever its weight."""

    async def serve() -> None:
        while True:
            await asyncio.sleep(every_s)
            router.attempt_started(revision)
            router.attempt_finished(revision, "200", 0.01)
            router.first_byte(revision, 0.005)

    async with in_background(serve):
        yield


async def test_a_quiet_canary_is_promoted_on_its_accumulated_requests(cluster: Cluster) -> None:
    router = await router_pod(cluster)
    rollout = {"steps": [{"weight": 25, "pause": "1s"}, {"weight": 50, "pause": "1s"}],
               "analysis": {"interval": "1s", "minRequests": 3}, "drainPeriod": "0s"}
    samples: list[dict[str, Any]] = []
    await cluster.create_isvc(isvc_manifest(rollout=rollout))
    async with running_operator(cluster.server, resync_s=HOUR):
        old = await serve_first_revision(cluster, isvc_manifest(rollout=rollout))
        async with serving_load(router, old):
            new = await start_canary(cluster, rollout)
            async with trickle(router, new, every_s=1.2):

                async def promoted() -> bool:
                    status = (await cluster.isvc()).get("status", {})
                    last = (status.get("canary") or {}).get("lastAnalysis")
                    if last is not None and last not in samples:
                        samples.append(last)
                    return {t["revision"]: t["weight"] for t in status.get("traffic", [])} == {new: 100}

                await eventually(promoted, timeout=40, what="the quiet canary promoted step by step")
    assert max(s["requests"] for s in samples if s["verdict"] == "Inconclusive") < 3
    judged = [s for s in samples if s["verdict"] == "Pass"]
    assert judged and all(s["requests"] >= 3 for s in judged), samples
    assert any("judged on the" in r for s in judged for r in s["reasons"]), judged
    assert not any(s["verdict"] == "Fail" for s in samples)


async def test_a_canary_without_requests_pauses_then_waits_for_someone(cluster: Cluster) -> None:
    router = await router_pod(cluster)
    rollout = {"steps": [{"weight": 50, "pause": "1s"}],
               "analysis": {"interval": "1s", "minRequests": 2, "maxInconclusiveDuration": "3s"},
               "drainPeriod": "0s"}  # onInconclusive: Pause, the default
    await cluster.create_isvc(isvc_manifest(rollout=rollout))
    async with running_operator(cluster.server, resync_s=HOUR):
        old = await serve_first_revision(cluster, isvc_manifest(rollout=rollout))
        async with serving_load(router, old):
            new = await start_canary(cluster, rollout)

            async def paused(times: int) -> dict[str, Any]:
                isvc = await cluster.isvc()
                progressing = condition(isvc, "Progressing")
                assert (isvc["status"]["phase"], progressing["status"], progressing["reason"]) == (
                    "Paused", "False", "InconclusiveTooLong")
                assert len(await cluster.events("InconclusiveTooLong")) >= times
                return progressing

            progressing = await eventually(lambda: paused(1), timeout=20, what="the pause after 3 s")
            assert "minRequests 2" in progressing["message"] and "0 canary requests" in progressing["message"]
            assert await traffic(cluster) == {old: 50, new: 50}, "paused at its step's traffic"

            await annotate(cluster, "retry")
            await eventually(lambda: cluster.events("Resumed"), timeout=10, what="retry resuming the step")
            await eventually(lambda: paused(2), timeout=20, what="paused again, 3 s after the retry")
            assert await traffic(cluster) == {old: 50, new: 50}

            await annotate(cluster, "promote")

            async def promoted() -> bool:
                return await traffic(cluster) == {new: 100}

            await eventually(promoted, timeout=10, what="promote acting on the paused canary")
    assert not (await cluster.isvc())["status"].get("failedRevisions")


async def annotate(cluster: Cluster, override: str) -> None:
    await cluster.call(cluster.kube.merge_patch, "serving.folio.dev/v1alpha1", "InferenceService", NAMESPACE,
                       "chat", {"metadata": {"annotations": {f"folio.dev/{override}": "now"}}})
