"""An InferencePool asked for where the cluster has no InferencePool CRD: said in status, serving goes on."""

from __future__ import annotations

from typing import Any

import kmock
import pytest

from folio.operator.controller.discovery import OPTIONAL, Discovery
from folio.operator.k8s.client import Kube
from folio.operator.serving.inference_pool import API_VERSION, KIND, PLURAL
from tests.operator.harness import (
    ApiServer,
    Cluster,
    bring_up,
    condition,
    eventually,
    isvc_manifest,
    running_operator,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.kmock(cls=ApiServer)]

POOLS = f"{API_VERSION}/{PLURAL}"
REASON = OPTIONAL[(API_VERSION, KIND)][0]


async def test_a_missing_inference_pool_crd_is_reported_and_serving_goes_on(cluster: Cluster) -> None:
    del cluster.server.resources[POOLS]  # the Gateway API inference extension is not installed
    manifest = isvc_manifest(router={"inferencePool": True})
    discovery = Discovery(cluster.kube, ttl_s=0.2)
    async with running_operator(cluster.server, discovery=discovery):
        rev = await bring_up(cluster, manifest)  # Ready: the engine and the router run as always

        async def degraded() -> dict[str, Any]:
            cond = condition(await cluster.isvc(), "Degraded")
            assert cond["status"] == "True" and cond["reason"] == REASON, cond
            return cond

        cond = await degraded()
        assert "inferencepools.inference.networking.k8s.io" in cond["message"]
        assert "spec.router.inferencePool" in cond["message"]
        assert condition(await cluster.isvc(), "Ready")["status"] == "True"
        assert await cluster.get("apps/v1", "Deployment", f"chat-{rev}") is not None  # the engine
        assert await cluster.get("apps/v1", "Deployment", "chat") is not None  # the router
        # nothing was sent where nothing can hold it (the emulator would have stored it all the same)
        assert await cluster.get(API_VERSION, KIND, "chat") is None
        events = await eventually(lambda: cluster.events(REASON), what="a Warning Event")
        assert events[0]["type"] == "Warning"

        # The CRD is installed: the pool is published and Degraded clears, without a restart.
        cluster.server.resources[POOLS] = kmock.ResourceInfo(
            kind=KIND, namespaced=True, subresources={"status"},
            verbs={"get", "list", "watch", "patch", "create", "delete"},
        )  # fmt: skip
        await eventually(lambda: cluster.get(API_VERSION, KIND, "chat"), what="the InferencePool")

        async def recovered() -> bool:
            return condition(await cluster.isvc(), "Degraded")["status"] == "False"

        await eventually(recovered, what="Degraded=False")
        assert len(await cluster.events(REASON)) == 1  # once, not once per pass


async def test_a_service_that_does_not_ask_for_a_pool_never_looks(cluster: Cluster) -> None:
    del cluster.server.resources[POOLS]
    async with running_operator(cluster.server):
        await bring_up(cluster, isvc_manifest())
        assert condition(await cluster.isvc(), "Degraded")["status"] == "False"
        assert not await cluster.events(REASON)


async def test_discovery_reads_the_group_version_and_remembers_for_a_while(cluster: Cluster) -> None:
    await cluster.call(_discovery_remembers, str(cluster.server.url), cluster.server)


def _discovery_remembers(url: str, server: kmock.KubernetesEmulator) -> None:
    now = [0.0]
    calls: list[tuple[str, str]] = []

    class Counting(Kube):
        def serves(self, api_version: str, kind: str) -> bool:
            calls.append((api_version, kind))
            return super().serves(api_version, kind)

    discovery = Discovery(Counting.for_url(url), ttl_s=30.0, clock=lambda: now[0])
    pool = (API_VERSION, KIND)
    assert discovery.unavailable([pool, ("apps/v1", "Deployment"), pool]) == []  # declared: served
    del server.resources[POOLS]
    assert discovery.unavailable([pool]) == [] and len(calls) == 1  # remembered
    now[0] = 31.0
    assert discovery.unavailable([pool, pool]) == [pool] and len(calls) == 2  # looked again once
    assert discovery.unavailable([("apps/v1", "Deployment")]) == []  # not optional: never looked up
    assert not Kube.for_url(url).serves(API_VERSION, KIND)
    assert Kube.for_url(url).serves("apps/v1", "Deployment") and Kube.for_url(url).serves("v1", "Service")
