"""An optional kind (InferencePool, KEDA's ScaledObject) asked for where the cluster has no CRD for it:
said in status, serving goes on; a service that does not ask for it never looks."""

from __future__ import annotations

from typing import Any

import kmock
import pytest

from folio.operator.controller.discovery import OPTIONAL, OPTIONALS, Discovery, asked_for
from folio.operator.k8s.client import Kube
from folio.operator.k8s.names import HTTP_ROUTE, MANAGED_KINDS, SCALED_OBJECT
from folio.operator.serving.inference_pool import API_VERSION, KIND, PLURAL
from folio.operator.serving.objects import PlanSettings
from folio.operator.spec import InferenceServiceSpec
from tests.operator.harness import (
    ApiServer,
    Cluster,
    bring_up,
    condition,
    eventually,
    isvc_manifest,
    rev_of,
    running_operator,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.kmock(cls=ApiServer)]

POOLS = f"{API_VERSION}/{PLURAL}"
REASON = OPTIONAL[(API_VERSION, KIND)][0]
KEDA_REASON = OPTIONAL[SCALED_OBJECT][0]
PROMETHEUS = {"analysis": {"prometheus": {"url": "http://prometheus:9090"}}}
GATEWAY = {"name": "inference-gateway"}
KEDA = {"minReplicas": 1, "maxReplicas": 2, "metric": "InFlight", "target": 2, "keda": True}
# The groups Kubernetes itself serves: every other kind Folio creates is optional (its CRD may be absent).
BUILT_IN_GROUPS = {"", "apps", "batch", "policy", "rbac.authorization.k8s.io", "networking.k8s.io",
                   "discovery.k8s.io"}


def test_every_kind_from_someone_elses_crd_is_checked_as_optional() -> None:
    foreign = {kind for kind in MANAGED_KINDS if kind[0].rpartition("/")[0] not in BUILT_IN_GROUPS}
    assert foreign == set(OPTIONAL) == {o.kind for o in OPTIONALS}
    assert {o.reason for o in OPTIONALS} == {"InferencePoolUnavailable", "HTTPRouteUnavailable",
                                             "ScaledObjectUnavailable", "LeaderWorkerSetUnavailable"}
    for o in OPTIONALS:  # each message names the CRD to install
        assert o.message.count(".") and o.kind[0] in o.message, o.message


@pytest.mark.parametrize(
    ("spec", "settings", "kinds"),
    [
        ({}, PlanSettings(), []),
        ({}, PlanSettings(inference_pool=True), [(API_VERSION, KIND)]),
        ({"router": {"inferencePool": False}}, PlanSettings(inference_pool=True), []),
        ({"router": {"inferencePool": True}}, PlanSettings(), [(API_VERSION, KIND)]),
        ({"autoscaling": {**KEDA, "keda": False}, "rollout": PROMETHEUS}, PlanSettings(), []),
        ({"autoscaling": KEDA, "rollout": PROMETHEUS}, PlanSettings(), [SCALED_OBJECT]),
        ({"autoscaling": KEDA, "rollout": PROMETHEUS, "router": {"inferencePool": True}}, PlanSettings(),
         [(API_VERSION, KIND), SCALED_OBJECT]),
        # an HTTPRoute only with the pools and a Gateway to attach it to
        ({"router": {"inferencePool": True, "gateway": GATEWAY}}, PlanSettings(), [(API_VERSION, KIND), HTTP_ROUTE]),
        ({"router": {"gateway": GATEWAY}}, PlanSettings(inference_pool=True), [(API_VERSION, KIND), HTTP_ROUTE]),
        ({"router": {"inferencePool": False, "gateway": GATEWAY}}, PlanSettings(inference_pool=True), []),
    ],
)
def test_asked_for_lists_the_optional_kinds_a_spec_needs(
    spec: dict[str, Any], settings: PlanSettings, kinds: list[tuple[str, str]]
) -> None:
    manifest = isvc_manifest(**spec)
    assert asked_for(InferenceServiceSpec.model_validate(manifest["spec"]), settings) == kinds


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
        assert await cluster.get(API_VERSION, KIND, f"chat-{rev}") is None  # a pool per revision
        events = await eventually(lambda: cluster.events(REASON), what="a Warning Event")
        assert events[0]["type"] == "Warning"

        # The CRD is installed: the pool is published and Degraded clears, without a restart.
        cluster.server.resources[POOLS] = kmock.ResourceInfo(
            kind=KIND, namespaced=True, subresources={"status"},
            verbs={"get", "list", "watch", "patch", "create", "delete"},
        )  # fmt: skip
        await eventually(lambda: cluster.get(API_VERSION, KIND, f"chat-{rev}"), what="the InferencePool")

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


async def test_without_keda_a_service_that_does_not_ask_for_it_is_ready(cluster: Cluster) -> None:
    assert not await cluster.call(cluster.kube.serves, *SCALED_OBJECT)  # KEDA is not installed
    lookups: list[tuple[str, str]] = []

    class Counting(Kube):
        def serves(self, api_version: str, kind: str) -> bool:
            lookups.append((api_version, kind))
            return super().serves(api_version, kind)

    discovery = Discovery(Counting.for_url(str(cluster.server.url)), ttl_s=0.0)
    async with running_operator(cluster.server, discovery=discovery):
        await bring_up(cluster, isvc_manifest(autoscaling={**KEDA, "keda": False}, rollout=PROMETHEUS))
        isvc = await cluster.isvc()
        assert condition(isvc, "Degraded")["status"] == "False"
        assert isvc["status"]["autoscaling"].get("keda") is not True  # Folio's own autoscaler
        assert not await cluster.events(KEDA_REASON)
    assert lookups == []  # nothing asked for: never looked
    assert _scaled_object_requests(cluster) == []  # no API call that could fail (kopf only logs the kind)


async def test_without_keda_a_keda_service_reports_it_and_still_serves(cluster: Cluster) -> None:
    manifest = isvc_manifest(autoscaling=KEDA, rollout=PROMETHEUS)
    discovery = Discovery(cluster.kube, ttl_s=0.2)
    async with running_operator(cluster.server, discovery=discovery):
        rev = await bring_up(cluster, manifest)  # Ready: the Deployment keeps its replicas, Folio scales it

        async def degraded() -> dict[str, Any]:
            cond = condition(await cluster.isvc(), "Degraded")
            assert cond["status"] == "True" and cond["reason"] == KEDA_REASON, cond
            return cond

        cond = await eventually(degraded, what=f"Degraded={KEDA_REASON}")
        assert "scaledobjects.keda.sh" in cond["message"] and "spec.autoscaling.keda" in cond["message"]
        isvc = await cluster.isvc()
        assert condition(isvc, "Ready")["status"] == "True"
        assert isvc["status"]["autoscaling"].get("keda") is not True, isvc["status"]["autoscaling"]
        dep = await cluster.get("apps/v1", "Deployment", f"chat-{rev}")
        assert dep is not None and dep["spec"]["replicas"] == 1  # minReplicas, from Folio's own autoscaler
        assert rev == rev_of(manifest)
        assert _scaled_object_requests(cluster) == []  # nothing sent where nothing can hold it
        events = await eventually(lambda: cluster.events(KEDA_REASON), what="a Warning Event")
        assert events[0]["type"] == "Warning"

        # KEDA is installed: the ScaledObject is applied, KEDA scales, and Degraded clears, without a restart.
        cluster.server.resources[f"{SCALED_OBJECT[0]}/scaledobjects"] = kmock.ResourceInfo(
            kind=SCALED_OBJECT[1], namespaced=True, subresources={"status"},
            verbs={"get", "list", "watch", "patch", "create", "delete"},
        )  # fmt: skip
        await eventually(lambda: cluster.get(*SCALED_OBJECT, f"chat-{rev}"), what="the ScaledObject")

        async def handed_to_keda() -> bool:
            isvc = await cluster.isvc()
            return condition(isvc, "Degraded")["status"] == "False" and isvc["status"]["autoscaling"]["keda"]

        await eventually(handed_to_keda, what="Degraded=False, scaled by KEDA")
        assert len(await cluster.events(KEDA_REASON)) == 1  # once, not once per pass


def _scaled_object_requests(cluster: Cluster) -> list[str]:
    """Every request the emulator got for ScaledObjects (kmock records them all)."""
    return [f"{r.method} {r.url}" for r in cluster.server
            if r.resource is not None and r.resource.plural == "scaledobjects"]  # fmt: skip


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
