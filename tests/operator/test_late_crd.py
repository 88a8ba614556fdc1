"""An optional kind whose CRD is installed after the operator started: used without a restart.

The operator starts where the cluster does not serve the kind (kopf finds nothing to watch for it); a
service asking for it is Degraded with the kind's `*Unavailable` reason. Then the CRD is installed: within
the discovery TTL the object is applied, Degraded clears, and kopf watches the kind from then on (it is
in the operator's index: deleting the service deletes it too, which only the index can tell the operator
to do; the emulator has no garbage collector), and the operator says so once in its log.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import kmock
import kopf
import pytest

from folio.operator.controller.discovery import OPTIONAL, Discovery
from folio.operator.k8s.client import ApiError
from folio.operator.k8s.names import INFERENCE_POOL, PLURALS, SCALED_OBJECT, base_labels
from tests.operator.harness import (
    NAMESPACE,
    ApiServer,
    Cluster,
    bring_up,
    condition,
    eventually,
    isvc_manifest,
    running_operator,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.kmock(cls=ApiServer)]

TTL_S = 1.0  # the discovery TTL here (30 s in production): the bound on noticing the CRD
KEDA = {"minReplicas": 1, "maxReplicas": 2, "metric": "InFlight", "target": 2, "keda": True}
CASES = {  # the kind, and a spec that asks for it
    "InferencePool": (INFERENCE_POOL, {"router": {"inferencePool": True}}),
    "ScaledObject": (SCALED_OBJECT, {"autoscaling": KEDA, "rollout": {"analysis": {"prometheus": {
        "url": "http://prometheus:9090"}}}}),
}


def _key(kind: tuple[str, str]) -> str:
    return f"{kind[0]}/{PLURALS[kind]}"


def install_crd(server: kmock.KubernetesEmulator, kind: tuple[str, str]) -> None:
    """What installing the kind's CRD changes for a client: the API server serves (and discovers) it."""
    server.resources[_key(kind)] = kmock.ResourceInfo(
        kind=kind[1], namespaced=True, subresources={"status"},
        verbs={"get", "list", "watch", "patch", "create", "delete"},
    )  # fmt: skip


async def _objects(cluster: Cluster, kind: tuple[str, str]) -> list[dict[str, Any]]:
    """The service's objects of ``kind`` (by its labels, whatever their names); none where it is not served."""
    try:
        return await cluster.call(cluster.kube.list, *kind, NAMESPACE, base_labels("chat"))
    except ApiError as exc:
        if exc.status == 404:
            return []
        raise


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_crd_installed_later_is_watched_and_used(cluster: Cluster, case: str,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    kind, spec = CASES[case]
    cluster.server.resources.pop(_key(kind), None)  # not installed when the operator starts
    reason = OPTIONAL[kind][0]
    manifest = isvc_manifest(**spec)
    async with running_operator(cluster.server, discovery=Discovery(cluster.kube, ttl_s=TTL_S)):
        await bring_up(cluster, manifest)

        async def degraded() -> bool:
            cond = condition(await cluster.isvc(), "Degraded")
            assert cond["status"] == "True" and cond["reason"] == reason, cond
            return True

        await eventually(degraded, what=f"Degraded={reason}")
        assert await _objects(cluster, kind) == []

        with caplog.at_level(logging.INFO, logger="kopf.objects"):
            install_crd(cluster.server, kind)
            installed = time.monotonic()
            await eventually(lambda: _objects(cluster, kind), timeout=TTL_S + 10, what=f"the {case}")

            async def recovered() -> bool:
                return condition(await cluster.isvc(), "Degraded")["status"] == "False"

            await eventually(recovered, what="Degraded=False")
            took = time.monotonic() - installed
            print(f"{case} used {took:.1f} s after its CRD was installed (discovery TTL {TTL_S:g} s)")
            assert took <= TTL_S + 5
            told = [r.getMessage() for r in caplog.records if "its CRD installed after the operator" in r.getMessage()]
            assert len(told) == 1 and kind[1] in told[0], told

        # Indexed: the operator deletes it with its InferenceService (nothing else would, in the emulator).
        await cluster.delete_isvc()

        async def deleted_with_its_service() -> bool:
            return await _objects(cluster, kind) == [] and (
                await cluster.get(manifest["apiVersion"], "InferenceService", "chat") is None)

        await eventually(deleted_with_its_service, what=f"the {case} deleted with its InferenceService")


async def test_a_failed_scan_does_not_fail_the_pass_and_is_tried_again_later(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from folio.operator.controller import watches as module

    scans: list[set[str]] = []

    async def failing(*, groups: set[str], **_: object) -> None:
        scans.append(groups)
        raise ConnectionError("the API server is away")

    monkeypatch.setattr(module, "scan_resources", failing)
    now = [0.0]
    registry = kopf.OperatorRegistry()
    watches = module.Watches(registry, kopf.OperatorSettings(), rescan_s=10.0, clock=lambda: now[0])
    assert not watches.watched(INFERENCE_POOL)
    await watches.ensure([INFERENCE_POOL, INFERENCE_POOL])
    await watches.ensure([INFERENCE_POOL])  # within rescan_s: not asked again
    assert scans == [{"inference.networking.k8s.io"}]
    assert "could not read the API group inference.networking.k8s.io" in caplog.text
    now[0] = 11.0
    await watches.ensure([INFERENCE_POOL])
    assert len(scans) == 2
