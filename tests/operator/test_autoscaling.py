"""The operator's autoscaler against kmock: up on the routers' in-flight, down after the delay, to zero,
back up when asked (the scale-up annotation) and when a router holds requests (its held gauge)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from folio.operator.k8s.names import component_labels
from folio.operator.router.metrics import RouterMetrics
from folio.operator.router.server import bind
from folio.operator.spec import SCALE_UP_ANNOTATION
from tests.operator.harness import (
    NAMESPACE,
    ApiServer,
    Cluster,
    condition,
    declare_resources,
    eventually,
    isvc_manifest,
    rev_of,
    running_operator,
    serve_first_revision,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.kmock(cls=ApiServer)]

AUTOSCALING = {"minReplicas": 0, "maxReplicas": 4, "metric": "InFlight", "target": 2, "scaleDownDelay": "1s"}


class FakeRouterPod:
    """A router pod's /metrics on loopback, with the in-flight count the test sets."""

    def __init__(self) -> None:
        self.metrics = RouterMetrics("chat")
        self.in_flight = 0
        self.url = ""

    def set_in_flight(self, n: int) -> None:
        while self.in_flight < n:
            self.metrics.attempt_started("r")
            self.in_flight += 1
        while self.in_flight > n:
            self.metrics.attempt_abandoned("r")
            self.in_flight -= 1

    def set_held(self, n: int) -> None:
        self.metrics.held.labels(self.metrics.isvc).set(n)

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain")

    @asynccontextmanager
    async def running(self) -> AsyncIterator[int]:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = bind("127.0.0.1", 0)
        await web.SockSite(runner, sock).start()
        try:
            yield sock.getsockname()[1]
        finally:
            await runner.cleanup()


def router_pod(port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "chat-router-1", "namespace": NAMESPACE, "labels": component_labels("chat", "router")},
        "spec": {"containers": [{"name": "router", "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1"},
    }  # fmt: skip


async def test_replicas_follow_in_flight_scale_to_zero_and_come_back_when_asked_or_held(cluster: Cluster) -> None:
    manifest = isvc_manifest(replicas=1, autoscaling=AUTOSCALING)
    fake = FakeRouterPod()
    async with fake.running() as port, running_operator(cluster.server):
        await cluster.create_isvc(manifest)
        rev = await serve_first_revision(cluster, manifest)
        await cluster.call(cluster.kube.create, router_pod(port))

        async def replicas(n: int) -> dict[str, Any] | None:
            dep = await cluster.get("apps/v1", "Deployment", f"chat-{rev}")
            auto = (await cluster.isvc())["status"].get("autoscaling") or {}
            ok = dep is not None and dep["spec"]["replicas"] == n and auto.get("desiredReplicas") == n
            return auto if ok else None

        fake.set_in_flight(7)  # 7 in flight at target 2: 4 replicas
        auto = await eventually(lambda: replicas(4), what="scaled up to 4")
        assert auto["metric"] == "InFlight" and auto["value"] == 7 and auto["lastScaleTime"]
        assert auto["currentReplicas"] == 1
        assert await cluster.events("ScaledUp")

        fake.set_in_flight(0)  # idle, but three replicas are still loading: no scale down
        await eventually(lambda: _reason_has(cluster, "start"), what="scale down deferred while replicas start")
        dep = await cluster.get("apps/v1", "Deployment", f"chat-{rev}")
        assert dep is not None and dep["spec"]["replicas"] == 4
        await cluster.set_status("apps/v1", "Deployment", f"chat-{rev}", {"readyReplicas": 4, "replicas": 4})
        await eventually(lambda: replicas(0), what="scaled to zero after scaleDownDelay")
        assert await cluster.events("ScaledToZero")
        await cluster.set_status("apps/v1", "Deployment", f"chat-{rev}", {"readyReplicas": 0, "replicas": 0})

        async def ready_at_zero() -> bool:
            ready = condition(await cluster.isvc(), "Ready")
            return ready["status"] == "True" and ready["reason"] == "ScaledToZero"

        await eventually(ready_at_zero, what="Ready=True at zero (the routers hold requests)")

        # A router holding requests asks with an annotation: one replica, and the annotation is removed.
        patch = {"metadata": {"annotations": {SCALE_UP_ANNOTATION: "2026-12-03T00:00:00Z"}}}
        await cluster.call(cluster.kube.merge_patch, "serving.folio.dev/v1alpha1", "InferenceService", NAMESPACE,
                           "chat", patch)
        await eventually(lambda: replicas(1), what="scaled up from zero when asked")

        async def annotation_removed() -> bool:
            return SCALE_UP_ANNOTATION not in ((await cluster.isvc())["metadata"].get("annotations") or {})

        await eventually(annotation_removed, what="the scale-up annotation removed")

        # Back to zero; then a router holding requests is the ask: its held gauge, read at the next look.
        await cluster.set_status("apps/v1", "Deployment", f"chat-{rev}", {"readyReplicas": 1, "replicas": 1})
        await eventually(lambda: replicas(0), what="scaled to zero again")
        await cluster.set_status("apps/v1", "Deployment", f"chat-{rev}", {"readyReplicas": 0, "replicas": 0})
        fake.set_held(3)
        auto = await eventually(lambda: replicas(2), what="scaled up from zero for the held requests")
        assert auto["value"] == 3, auto  # in flight 0 plus 3 held, at target 2


async def _reason_has(cluster: Cluster, text: str) -> bool:
    auto = (await cluster.isvc())["status"].get("autoscaling") or {}
    return text in auto.get("reason", "")


async def test_keda_renders_scaled_objects_and_prunes_them_when_turned_off(cluster: Cluster) -> None:
    declare_resources(cluster.server, keda=True)
    keda = {**AUTOSCALING, "metric": "Waiting", "keda": True}
    manifest = isvc_manifest(replicas=1, autoscaling=keda,
                             rollout={"analysis": {"prometheus": {"url": "http://prometheus:9090"}}})
    async with running_operator(cluster.server):
        await cluster.create_isvc(manifest)
        rev = rev_of(manifest)
        await eventually(lambda: cluster.get("batch/v1", "Job", f"chat-prepull-{rev}"), what="pre-pull Job")
        await cluster.set_status("batch/v1", "Job", f"chat-prepull-{rev}", {"succeeded": 1})
        scaled = await eventually(lambda: cluster.get("keda.sh/v1alpha1", "ScaledObject", f"chat-{rev}"),
                                  what="the ScaledObject")
        assert scaled["spec"]["scaleTargetRef"]["name"] == f"chat-{rev}"
        assert "vllm:num_requests_waiting" in scaled["spec"]["triggers"][0]["metadata"]["query"]
        # (that the Deployment is applied without replicas is tested on the rendered objects: the emulator
        # merges an apply into what is stored, where a real server's field ownership removes the field)
        auto = await eventually(lambda: _autoscaling(cluster), what="status.autoscaling")
        assert "KEDA" in auto["reason"]

        await cluster.update_spec("chat", {"autoscaling": {**keda, "keda": False}})

        async def pruned() -> bool:
            return await cluster.get("keda.sh/v1alpha1", "ScaledObject", f"chat-{rev}") is None

        await eventually(pruned, what="the ScaledObject pruned once keda is off")
        dep = await cluster.get("apps/v1", "Deployment", f"chat-{rev}")
        assert dep is not None and dep["spec"]["replicas"] == 1  # Folio's own autoscaler again


async def _autoscaling(cluster: Cluster) -> dict[str, Any] | None:
    return (await cluster.isvc()).get("status", {}).get("autoscaling")
