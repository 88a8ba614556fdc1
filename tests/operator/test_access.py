"""spec.access in a cluster: the routers' Role on their one Secret, and the Secret's problems in status."""

from __future__ import annotations

import base64

import pytest

from folio.operator.router.tenants import INVALID_ACCESS
from tests.operator.harness import (
    NAMESPACE,
    ApiServer,
    Cluster,
    bring_up,
    condition,
    declare_resources,
    eventually,
    isvc_manifest,
    running_operator,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.kmock(cls=ApiServer)]

ACCESS = {"apiKeysSecretRef": {"name": "llm-keys"}, "tenants": [{"name": "search", "priority": "Critical"},
                                                                {"name": "batch"}]}  # fmt: skip


def secret(**keys: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "llm-keys", "namespace": NAMESPACE},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()}}  # fmt: skip


async def degraded(cluster: Cluster) -> dict[str, str]:
    return condition(await cluster.isvc(), "Degraded")


async def test_the_secrets_problems_show_in_status_and_clear_when_mended(kmock: ApiServer) -> None:
    declare_resources(kmock)
    cluster = Cluster(kmock)
    await cluster.call(cluster.kube.create, secret(search="sk-1\nsk-shared\n", eval="sk-shared"))
    async with running_operator(cluster.server):
        await bring_up(cluster, isvc_manifest(access=ACCESS))  # serving goes on: Ready despite the problems
        role = await cluster.get("rbac.authorization.k8s.io/v1", "Role", "chat-router-keys")
        assert role is not None and role["rules"][0]["resourceNames"] == ["llm-keys"]
        binding = await cluster.get("rbac.authorization.k8s.io/v1", "RoleBinding", "chat-router-keys")
        assert binding is not None and binding["subjects"][0]["name"] == "chat-router"

        async def reported() -> bool:
            d = await degraded(cluster)
            return d["status"] == "True" and d["reason"] == INVALID_ACCESS

        await eventually(reported, what="Degraded=True InvalidAccess")
        message = (await degraded(cluster))["message"]
        assert "tenant 'batch' has no API key" in message and "(eval, search)" in message
        assert "sk-" not in str(await cluster.isvc())  # no key in status

        await cluster.call(cluster.kube.delete, "v1", "Secret", NAMESPACE, "llm-keys")
        await eventually(
            lambda: _message_has(cluster, "'llm-keys' is missing"), what="the missing Secret said"
        )

        await cluster.call(cluster.kube.create, secret(search="sk-1", batch="sk-2"))

        async def mended() -> bool:
            return (await degraded(cluster))["status"] == "False"

        await eventually(mended, what="Degraded=False once the Secret is mended")


async def _message_has(cluster: Cluster, text: str) -> bool:
    return text in (await degraded(cluster)).get("message", "")
