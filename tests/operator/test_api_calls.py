"""What the operator really calls on the API server, recorded, against the chart's RBAC allow-list.

A whole lifecycle (create with an overflow key and an InferencePool, weights verified, serving, a new revision, delete) runs
against the emulator, which records every request the operator makes (kopf's and the executor's; the
test's own requests carry a marker header). Each (group, resource, verb) it made must be granted
(tests/chart/test_rbac.py's ALLOWED), and each granted one must have been made, but for the few
that only an admission check or a cluster feature uses (listed, with why). KEDA's ScaledObjects
(`spec.autoscaling.keda`, which needs KEDA's CRD) have a lifecycle of their own below.
"""

from __future__ import annotations

import base64
from typing import Any

import kmock
import pytest

from tests.chart.test_rbac import ALLOWED
from tests.operator.harness import (
    NAMESPACE,
    ApiServer,
    Cluster,
    bring_up,
    declare_resources,
    eventually,
    isvc_manifest,
    rev_of,
    running_operator,
)

pytestmark = [pytest.mark.timeout(90)]

TEST_CLIENT = "X-Folio-Test-Client"
Call = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)

# Granted, but never a request of its own: why each is still needed.
NOT_CALLED: dict[Call, str] = {
    # OwnerReferencesPermissionEnforcement checks it when a child's ownerReference blocks deletion
    ("serving.folio.dev", "inferenceservices/finalizers", "update"): "admission check",
    # only a parity gate given spec.rollout.parity.configMapRef reads it (tests/operator/test_parity_gate.py)
    ("", "configmaps", "get"): "a rollout feature this lifecycle does not use",
    # only engine pods that serve adapters carry the adapters readiness gate (tests/operator/test_adapters.py)
    ("", "pods/status", "patch"): "spec.adapters only: the adapters readiness gate",
    # held so that the operator may grant them: the routers' Role (spec.access) lists and watches its Secret
    ("", "secrets", "list"): "granted to the routers' Role; the API server asks the operator to hold it",
    ("", "secrets", "watch"): "granted to the routers' Role; the API server asks the operator to hold it",
    # this lifecycle has no RolloutPolicy: kopf lists and watches the kind, a policy's clock does the rest
    # (tests/operator/test_fleet.py)
    ("serving.folio.dev", "rolloutpolicies", "get"): "a RolloutPolicy's clock only",
    ("serving.folio.dev", "rolloutpolicies", "patch"): "a RolloutPolicy's finalizer (kopf) only",
    ("serving.folio.dev", "rolloutpolicies/status", "patch"): "a RolloutPolicy's clock only",
    **{("keda.sh", "scaledobjects", verb): "spec.autoscaling.keda only: test_keda_calls_what_the_chart_grants"
       for verb in ALLOWED[("keda.sh", "scaledobjects")]},
    # kopf lists and watches LeaderWorkerSets always; writes only for a replica of several pods
    **{("leaderworkerset.x-k8s.io", "leaderworkersets", verb):
       "a replica that spans several pods only: test_leader_worker_set_calls_what_the_chart_grants"
       for verb in ("create", "patch", "delete")},
}
# Not in ALLOWED's table but a rule of its own (tests/chart/test_rbac.py): `bind` on the chart's router
# ClusterRole, which the API server checks when the operator creates a router's RoleBinding.
VERBS = {"LIST": "list", "WATCH": "watch", "FETCH": "get", "CREATE": "create", "DELETE": "delete"}


class RecordingApiServer(ApiServer):
    calls: set[Call]

    async def _handle(self, request: kmock.Request) -> Any:
        # (discovery, which every authenticated client may read, names no resource)
        if request.resource is not None and request.resource.plural and TEST_CLIENT not in request.headers:
            resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
            action = request.action.name if request.action is not None else request.method
            verb = VERBS.get(action) or ("patch" if request.method == "PATCH" else "update")
            self.__class__.calls.add((request.resource.group or "", resource, verb))
        return await super()._handle(request)


@pytest.mark.kmock(cls=RecordingApiServer)
async def test_the_operator_calls_exactly_what_the_chart_grants(kmock: RecordingApiServer) -> None:
    RecordingApiServer.calls = set()
    declare_resources(kmock)
    cluster = Cluster(kmock)
    cluster.kube.client.set_default_header(TEST_CLIENT, "1")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "llm-keys", "namespace": NAMESPACE},
              "data": {"search": base64.b64encode(b"sk-1\n").decode()}}
    await cluster.call(cluster.kube.create, secret)
    manifest = isvc_manifest(
        access={"apiKeysSecretRef": {"name": "llm-keys"}, "tenants": [{"name": "search"}]},
        overflow={"url": "https://api.example", "apiKeySecretRef": {"name": "overflow-key"}},
        # opt-in, so only a lifecycle that asks for them calls their verbs (the pools', the route's)
        router={"inferencePool": True, "gateway": {"name": "inference-gateway"}},
    )
    async with running_operator(cluster.server):
        await bring_up(cluster, manifest)
        await cluster.update_spec("chat", {"engine": {"args": {"maxModelLen": 1024}}})  # a new revision: canary

        async def canary_job() -> bool:
            return any(k[0] == "Job" for k in await cluster.children())

        await eventually(canary_job, what="the canary's pre-pull Job")
        assert await cluster.get("rbac.authorization.k8s.io/v1", "Role", "chat-router-keys") is not None
        await cluster.update_spec("chat", {"access": None})  # the routers' Role is pruned

        async def role_pruned() -> bool:
            return await cluster.get("rbac.authorization.k8s.io/v1", "Role", "chat-router-keys") is None

        await eventually(role_pruned, what="the routers' Role pruned")
        await cluster.delete_isvc("chat")

        async def gone() -> bool:
            return await cluster.get(manifest["apiVersion"], "InferenceService", "chat") is None

        await eventually(gone, what="the InferenceService released")
    called = RecordingApiServer.calls
    granted = {(group, resource, verb) for (group, resource), verbs in ALLOWED.items() for verb in verbs}
    assert called - granted == set(), "the operator calls what the chart does not grant"
    assert granted - called - set(NOT_CALLED) == set(), "the chart grants what the operator never calls"
    # Secrets by name only (spec.access's): never a list or a watch of a namespace's Secrets
    assert {c for c in called if c[1] == "secrets"} == {("", "secrets", "get")}


@pytest.mark.kmock(cls=RecordingApiServer)
async def test_keda_calls_what_the_chart_grants(kmock: RecordingApiServer) -> None:
    """With KEDA installed and `autoscaling.keda`: a ScaledObject created, changed, pruned, indexed."""
    RecordingApiServer.calls = set()
    declare_resources(kmock, keda=True)
    cluster = Cluster(kmock)
    cluster.kube.client.set_default_header(TEST_CLIENT, "1")
    keda = {"minReplicas": 0, "maxReplicas": 4, "metric": "Waiting", "target": 2, "keda": True}
    manifest = isvc_manifest(autoscaling=keda, rollout={"analysis": {"prometheus": {"url": "http://prometheus:9090"}}})
    rev = rev_of(manifest)
    async with running_operator(cluster.server):
        await cluster.create_isvc(manifest)
        await eventually(lambda: cluster.get("batch/v1", "Job", f"chat-prepull-{rev}"), what="pre-pull Job")
        await cluster.set_status("batch/v1", "Job", f"chat-prepull-{rev}", {"succeeded": 1})
        await eventually(lambda: scaled_object(cluster, rev, 4), what="the ScaledObject")
        await cluster.update_spec("chat", {"autoscaling": {**keda, "maxReplicas": 6}})
        await eventually(lambda: scaled_object(cluster, rev, 6), what="the ScaledObject changed")
        await cluster.update_spec("chat", {"autoscaling": {**keda, "keda": False}})

        async def pruned() -> bool:
            return await cluster.get("keda.sh/v1alpha1", "ScaledObject", f"chat-{rev}") is None

        await eventually(pruned, what="the ScaledObject pruned once keda is off")
    called = RecordingApiServer.calls
    granted = {(group, resource, verb) for (group, resource), verbs in ALLOWED.items() for verb in verbs}
    assert called - granted == set(), "the operator calls what the chart does not grant"
    keda_granted = {("keda.sh", "scaledobjects", verb) for verb in ALLOWED[("keda.sh", "scaledobjects")]}
    assert keda_granted - called == set(), "the chart grants ScaledObject verbs the operator never calls"


@pytest.mark.kmock(cls=RecordingApiServer)
async def test_leader_worker_set_calls_what_the_chart_grants(kmock: RecordingApiServer) -> None:
    """A revision whose replica spans several pods: its LeaderWorkerSet created, scaled, deleted, indexed."""
    RecordingApiServer.calls = set()
    declare_resources(kmock)
    cluster = Cluster(kmock)
    cluster.kube.client.set_default_header(TEST_CLIENT, "1")
    groups = {"args": {"tensorParallelSize": 8, "pipelineParallelSize": 2}}
    manifest = isvc_manifest(engine=groups)
    rev = rev_of(manifest)
    lws = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", f"chat-{rev}")

    async def groups_asked(count: int) -> bool:
        found = await cluster.get(*lws)
        return found is not None and found["spec"].get("replicas") == count

    async with running_operator(cluster.server):
        await cluster.create_isvc(manifest)
        await eventually(lambda: cluster.get("batch/v1", "Job", f"chat-prepull-{rev}"), what="pre-pull Job")
        await cluster.set_status("batch/v1", "Job", f"chat-prepull-{rev}", {"succeeded": 1})
        await eventually(lambda: groups_asked(1), what="the LeaderWorkerSet")
        await cluster.update_spec("chat", {"replicas": 2})
        await eventually(lambda: groups_asked(2), what="the LeaderWorkerSet scaled")

        async def pruned() -> bool:
            return await cluster.get(*lws) is None

        await cluster.delete_isvc("chat")
        await eventually(pruned, what="the LeaderWorkerSet deleted with its InferenceService")
    called = RecordingApiServer.calls
    granted = {(group, resource, verb) for (group, resource), verbs in ALLOWED.items() for verb in verbs}
    assert called - granted == set(), "the operator calls what the chart does not grant"
    lws_granted = {("leaderworkerset.x-k8s.io", "leaderworkersets", verb)
                   for verb in ALLOWED[("leaderworkerset.x-k8s.io", "leaderworkersets")]}
    assert lws_granted - called == set(), "the chart grants LeaderWorkerSet verbs the operator never calls"


async def scaled_object(cluster: Cluster, rev: str, max_replicas: int) -> bool:
    found = await cluster.get("keda.sh/v1alpha1", "ScaledObject", f"chat-{rev}")
    return found is not None and found["spec"]["maxReplicaCount"] == max_replicas
