"""A Gateway follows the canary split: the real operator in kmock publishes one InferencePool per running
revision and an HTTPRoute whose weights are status.traffic at every step, back to 100/0 on a rollback;
a dropped revision's pool is pruned. Without the Gateway API's CRD the pools are still published and
status says why there is no route."""

from __future__ import annotations

from typing import Any

import kmock
import pytest

from folio.operator.controller.discovery import OPTIONAL, Discovery
from folio.operator.k8s.names import HTTP_ROUTE, INFERENCE_POOL, PLURALS, base_labels
from tests.operator.harness import (
    NAMESPACE,
    ApiServer,
    Cluster,
    bring_up,
    condition,
    eventually,
    isvc_manifest,
    running_operator,
    serve_first_revision,
)
from tests.operator.test_clock import SplitLoad, router_pod, serving_load, start_canary, traffic

pytestmark = [pytest.mark.timeout(90), pytest.mark.kmock(cls=ApiServer)]

GATEWAY = {"name": "inference-gateway", "namespace": "gateway-system"}
ROUTER = {"inferencePool": True, "gateway": GATEWAY}
ROUTES = f"{HTTP_ROUTE[0]}/{PLURALS[HTTP_ROUTE]}"
REASON = OPTIONAL[HTTP_ROUTE][0]


async def route_weights(cluster: Cluster) -> dict[str, int] | None:
    """The HTTPRoute's weights by revision (its pools are `chat-{revision}`), or None without a route."""
    route = await cluster.get(*HTTP_ROUTE, "chat")
    if route is None:
        return None
    (rule,) = route["spec"]["rules"]
    return {ref["name"].removeprefix("chat-"): ref["weight"] for ref in rule["backendRefs"]}


async def pools(cluster: Cluster) -> set[str]:
    listed = await cluster.call(cluster.kube.list, *INFERENCE_POOL, NAMESPACE, base_labels("chat"))
    return {obj["metadata"]["name"] for obj in listed}


def follows(cluster: Cluster, expected: dict[str, int]) -> Any:
    """A check: the route has exactly ``expected``, status.traffic agrees (a revision it leaves out: 0),
    and there is a pool per backend and no other. Cheapest first: a pass of these runs on the event loop
    that also plays the router's load, which must keep its pace for the analysis."""

    async def check() -> bool:
        weights = await route_weights(cluster)
        assert weights == expected, weights
        split = await traffic(cluster)
        assert {rev: split.get(rev, 0) for rev in expected} == expected and set(split) <= set(expected), split
        assert await pools(cluster) == {f"chat-{rev}" for rev in expected}
        return True

    return check


async def test_the_route_follows_every_canary_step_and_the_old_pool_goes_with_its_revision(cluster: Cluster) -> None:
    router = await router_pod(cluster)
    rollout = {"steps": [{"weight": 10, "pause": "3s"}, {"weight": 50, "pause": "3s"}],
               "analysis": {"interval": "1s", "minRequests": 1}, "drainPeriod": "3s"}
    manifest = isvc_manifest(rollout=rollout, router=ROUTER)
    await cluster.create_isvc(manifest)
    async with running_operator(cluster.server):
        old = await serve_first_revision(cluster, manifest)
        await eventually(follows(cluster, {old: 100}), what="the route to the first revision's pool")
        route = await cluster.get(*HTTP_ROUTE, "chat")
        assert route is not None and route["spec"]["parentRefs"][0]["name"] == "inference-gateway"
        async with serving_load(router, old):
            new = await start_canary(cluster, rollout)
            async with serving_load(router, new):
                for step in ({old: 90, new: 10}, {old: 50, new: 50}):
                    await eventually(follows(cluster, step), timeout=15, what=f"the route at {step}")
                # promoted: the old revision drains at weight 0 and keeps its pool meanwhile
                await eventually(follows(cluster, {new: 100, old: 0}), timeout=15, what="the promotion")
                # drained and dropped: its pool is pruned and the route names the new one alone
                await eventually(follows(cluster, {new: 100}), timeout=15, what="the old pool pruned")


async def test_a_rollback_puts_the_route_back_to_stable_alone(cluster: Cluster) -> None:
    router = await router_pod(cluster)
    rollout = {"steps": [{"weight": 50, "pause": "1h"}],
               "analysis": {"interval": "2s", "failureLimit": 2, "minRequests": 5}}  # test_clock's pace
    manifest = isvc_manifest(rollout=rollout, router=ROUTER)
    await cluster.create_isvc(manifest)
    async with running_operator(cluster.server):
        old = await serve_first_revision(cluster, manifest)
        async with SplitLoad(cluster, router, old, canary_error_rate=0.5) as load:
            new = await start_canary(cluster, rollout)
            await eventually(follows(cluster, {old: 50, new: 50}), timeout=15, what="the canary's step")
            await eventually(lambda: load.canary_gone(), timeout=30, what="the rollback")
            # 100/0: all of it on stable; the failed canary runs nothing, so neither pool nor backend
            await eventually(follows(cluster, {old: 100}), timeout=15, what="the route back on stable")
        [failed] = (await cluster.isvc())["status"]["failedRevisions"]
        assert failed["revision"] == new


async def test_without_the_gateway_api_crd_the_pools_are_published_and_status_says_why(cluster: Cluster) -> None:
    del cluster.server.resources[ROUTES]  # the Gateway API's CRDs are not installed
    discovery = Discovery(cluster.kube, ttl_s=0.2)
    async with running_operator(cluster.server, discovery=discovery):
        rev = await bring_up(cluster, isvc_manifest(router=ROUTER))

        async def degraded() -> dict[str, Any]:
            cond = condition(await cluster.isvc(), "Degraded")
            assert cond["status"] == "True" and cond["reason"] == REASON, cond
            return cond

        cond = await eventually(degraded, what=f"Degraded={REASON}")
        assert "httproutes.gateway.networking.k8s.io" in cond["message"] and "spec.router.gateway" in cond["message"]
        assert condition(await cluster.isvc(), "Ready")["status"] == "True"
        assert await cluster.get(*INFERENCE_POOL, f"chat-{rev}") is not None  # the pools all the same

        # The CRD is installed: the route is published and Degraded clears, without a restart.
        cluster.server.resources[ROUTES] = kmock.ResourceInfo(
            kind=HTTP_ROUTE[1], namespaced=True, subresources={"status"},
            verbs={"get", "list", "watch", "patch", "create", "delete"},
        )  # fmt: skip
        await eventually(follows(cluster, {rev: 100}), what="the HTTPRoute")

        async def recovered() -> bool:
            return condition(await cluster.isvc(), "Degraded")["status"] == "False"

        await eventually(recovered, what="Degraded=False")
