"""The in-cluster source against kmock's Kubernetes emulator (real HTTP, real watch streams)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from folio.operator import metric_names as m
from folio.operator.k8s.client import AsyncKube
from folio.operator.router.kube import KubernetesSource, slice_urls
from folio.operator.serving.router import RouterConfig
from tests.router.conftest import RouterFactory
from tests.router.upstreams import FakeUpstream, free_port, serving, until_ready
from tests.support.wait import until

NS = "team"
ISVC_PATH = f"/apis/serving.folio.dev/v1alpha1/namespaces/{NS}/inferenceservices"
SLICES_PATH = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


def isvc(
    traffic: list[dict[str, Any]], stable: str, canary: str | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "serving.folio.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": NS, "resourceVersion": "1", "uid": "u1", "generation": 1},
        "spec": {"model": {"source": "hf://org/m", "revision": "0" * 40}, **spec},
        "status": {"traffic": traffic, "stableRevision": stable, "canaryRevision": canary},
    }


def endpoint_slice(name: str, service: str, port: int, *addresses: tuple[str, bool | None]) -> dict[str, Any]:
    endpoints = []
    for address, ready in addresses:
        endpoint: dict[str, Any] = {"addresses": [address]}
        if ready is not None:
            endpoint["conditions"] = {"ready": ready}
        endpoints.append(endpoint)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NS,
            "resourceVersion": "1",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": port}],
        "endpoints": endpoints,
    }


class Cluster:
    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def create(self, path: str, obj: dict[str, Any]) -> None:
        async with self.session.post(path, json=obj) as resp:
            assert resp.status in (200, 201), await resp.text()

    async def patch(self, path: str, patch: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.session.patch(path, json=patch, headers=headers) as resp:
            assert resp.status == 200, await resp.text()

    async def delete(self, path: str) -> None:
        async with self.session.delete(path) as resp:
            assert resp.status == 200, await resp.text()


@pytest.fixture
async def cluster(kmock: Any) -> Any:
    async with aiohttp.ClientSession(str(kmock.url)) as session:
        yield Cluster(session)


async def test_source_follows_status_slices_and_secret(kmock: Any, cluster: Cluster, tmp_path: Path) -> None:
    key_file = tmp_path / "api-key"  # where the pod mounts the Secret's key (no Secret read through the API)
    key_file.write_text("sk-overflow\n")
    await cluster.create(ISVC_PATH, isvc(
        [{"revision": "aaa", "weight": 90}, {"revision": "bbb", "weight": 10}], "aaa", "bbb",
        overflow={"url": "https://remote.example/v1", "apiKeySecretRef": {"name": "remote", "key": "apikey"}},
        shadow={"percent": 5},
    ))  # fmt: skip
    await cluster.create(
        SLICES_PATH,
        endpoint_slice(
            "chat-aaa-x1", "chat-aaa", 8000, ("10.0.0.1", True), ("10.0.0.2", None), ("10.0.0.3", False)
        ),
    )
    await cluster.create(SLICES_PATH, endpoint_slice("chat-bbb-x1", "chat-bbb", 8000, ("fd00::5", True)))
    await cluster.create(SLICES_PATH, endpoint_slice("other-aaa-x1", "other-aaa", 8000, ("10.9.9.9", True)))

    seen: list[RouterConfig] = []
    source = KubernetesSource("chat", NS, AsyncKube(str(kmock.url)), retry_max_s=0.1, overflow_key_file=key_file)
    task = asyncio.create_task(source.run(seen.append))
    try:
        await until(lambda: bool(seen) and seen[-1].endpoints.get("bbb") == ["http://[fd00::5]:8000"],
                    what="the first config")
        cfg = seen[-1]
        assert [(t.revision, t.weight) for t in cfg.traffic] == [("aaa", 90), ("bbb", 10)]
        assert cfg.stable == "aaa" and cfg.canary == "bbb"
        assert cfg.endpoints["aaa"] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]  # not the unready one
        assert "other" not in str(cfg.endpoints)  # another InferenceService's replicas
        assert cfg.overflow is not None and cfg.overflow.api_key == "sk-overflow"
        assert cfg.overflow.url == "https://remote.example"
        assert cfg.shadow_fraction == 0.05

        # the operator promotes: traffic moves, stable changes
        await cluster.patch(f"{ISVC_PATH}/chat", {"status": {
            "traffic": [{"revision": "bbb", "weight": 100}], "stableRevision": "bbb", "canaryRevision": None,
        }})  # fmt: skip
        await until(lambda: [t.revision for t in seen[-1].traffic] == ["bbb"], what="the promotion")
        assert seen[-1].stable == "bbb" and list(seen[-1].endpoints) == ["bbb"]

        # a replica goes away
        await cluster.delete(f"{SLICES_PATH}/chat-bbb-x1")
        await until(lambda: seen[-1].endpoints == {"bbb": []}, what="the replica gone")

        # the InferenceService is deleted: no traffic at all
        await cluster.delete(f"{ISVC_PATH}/chat")
        await until(lambda: seen[-1].traffic == [], what="no traffic")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_router_in_cluster_mode_routes_by_the_status(
    kmock: Any, cluster: Cluster, router: RouterFactory
) -> None:
    r1, r2 = FakeUpstream("r1"), FakeUpstream("r2")
    async with serving(r1, r2):
        for rev, up in (("r1", r1), ("r2", r2)):
            port = int(up.url.rsplit(":", 1)[1])
            await cluster.create(
                SLICES_PATH, endpoint_slice(f"chat-{rev}-abc", f"chat-{rev}", port, ("127.0.0.1", True))
            )
        await cluster.create(ISVC_PATH, isvc([{"revision": "r1", "weight": 100}], "r1"))
        source = KubernetesSource("chat", NS, AsyncKube(str(kmock.url)))
        async with router(source=source) as r:
            await until(lambda: r.app.state.ready()[0], what="the router ready")
            assert (await r.complete()).json()["served_by"] == "r1"
            await cluster.patch(
                f"{ISVC_PATH}/chat",
                {"status": {"traffic": [{"revision": "r1", "weight": 0}, {"revision": "r2", "weight": 100}]}},
            )
            await until(lambda: r.metric(m.WEIGHT, revision="r2") == 100, what="the new weights")
            assert (await r.complete()).json()["served_by"] == "r2"


def test_slice_port_and_readiness() -> None:
    obj = {
        "ports": [{"port": 7000}],
        "endpoints": [{"addresses": ["10.1.1.1", "10.1.1.2"]}, {"addresses": []}],
    }
    assert slice_urls(obj) == ["http://10.1.1.1:7000"]
    assert slice_urls({"endpoints": [{"addresses": ["h"], "conditions": {"ready": True}}]}) == [
        "http://h:8000"
    ]
    assert slice_urls({}) == []


async def test_folio_router_kubernetes_mode(
    kmock: Any, cluster: Cluster, folio_bin: str, tmp_path: Path
) -> None:
    """The CLI wiring of --kubernetes: credentials from a kubeconfig, objects from the emulator."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url)}}],
            "users": [{"name": "u", "user": {"token": "t0ken"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u", "namespace": NS}}],
        })
    )  # fmt: skip
    up = FakeUpstream("r1")
    async with serving(up):
        port = int(up.url.rsplit(":", 1)[1])
        await cluster.create(SLICES_PATH, endpoint_slice("chat-r1-a", "chat-r1", port, ("127.0.0.1", True)))
        await cluster.create(ISVC_PATH, isvc([{"revision": "r1", "weight": 100}], "r1"))
        router_port = free_port()
        proc = subprocess.Popen(
            [folio_bin, "router", "--name", "chat", "--kubernetes", "--namespace", NS, "--host", "127.0.0.1",
             "--port", str(router_port), "--log-level", "warning"],
            env={**os.environ, "KUBECONFIG": str(kubeconfig)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{router_port}", timeout=5) as client:
                await until_ready(client, proc)
                resp = await client.post("/v1/completions", json={"model": "m", "prompt": "x"})
                assert resp.status_code == 200 and resp.json()["served_by"] == "r1"
        finally:
            proc.send_signal(signal.SIGTERM)
            output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, output
    assert any(req.headers.get("Authorization") == "Bearer t0ken" for req in kmock)  # the kubeconfig token


SECRETS_PATH = f"/api/v1/namespaces/{NS}/secrets"


async def test_access_follows_its_secret_and_counts_the_routers(kmock: Any, cluster: Cluster) -> None:
    """spec.access through the API: the Secret of keys watched (its rotation and deletion seen), and the
    ready endpoints of the router's own Service counted, each router enforcing its share."""
    import base64

    def secret(**keys: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "llm-keys", "namespace": NS},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()}}  # fmt: skip

    await cluster.create(ISVC_PATH, isvc([{"revision": "aaa", "weight": 100}], "aaa",
                                         access={"apiKeysSecretRef": {"name": "llm-keys"},
                                                 "tenants": [{"name": "search", "requestsPerMinute": 60}]}))  # fmt: skip
    await cluster.create(
        SLICES_PATH, endpoint_slice("chat-r1", "chat", 8080, ("10.0.1.1", True), ("10.0.1.2", True))
    )
    await cluster.create(SECRETS_PATH, secret(search="sk-1\n"))
    seen: list[RouterConfig] = []
    keys: list[dict[str, list[str]] | None] = []
    source = KubernetesSource("chat", NS, AsyncKube(str(kmock.url)), retry_max_s=0.1)
    tasks = [
        asyncio.create_task(source.run(seen.append)),
        asyncio.create_task(source.follow("llm-keys", keys.append)),
    ]
    try:
        await until(lambda: bool(seen) and seen[-1].access is not None and seen[-1].access.routers == 2,
                    what="the access, shared by two routers")  # fmt: skip
        assert seen[-1].access is not None and seen[-1].access.api_keys_secret == "llm-keys"
        await until(lambda: keys and keys[-1] == {"search": ["sk-1"]}, what="the Secret's keys")
        await cluster.patch(
            f"{SECRETS_PATH}/llm-keys", {"data": {"search": base64.b64encode(b"sk-1\nsk-2").decode()}}
        )
        await until(lambda: keys[-1] == {"search": ["sk-1", "sk-2"]}, what="a key added")
        await cluster.delete(f"{SECRETS_PATH}/llm-keys")
        await until(lambda: keys[-1] is None, what="the Secret gone")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
