"""`folio status|promote|abort|retry` against a cluster (kmock's emulator over real HTTP)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest
import yaml

from folio.operator.cli import main
from folio.operator.spec import GROUP, PLURAL, VERSION, InferenceServiceSpec, revision_name

NAMESPACE = "ml"
PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
SPEC = {"model": {"source": "hf://org/m", "revision": "0" * 40}}
TARGET = revision_name(InferenceServiceSpec.model_validate(SPEC))
# a canary in progress, and the spec's revision failed before: every override has something to act on
STATUS = {
    "phase": "RolledBack",
    "stableRevision": "aaaaaaaaaa",
    "canaryRevision": "cccccccccc",
    "traffic": [{"revision": "aaaaaaaaaa", "weight": 100}],
    "failedRevisions": [{"revision": TARGET, "reason": "AnalysisFailed", "at": "2026-01-01T00:00:00Z"}],
    "conditions": [
        {"type": "Degraded", "status": "True", "reason": "AnalysisFailed", "message": "error rate 30%"}
    ],
}

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def cluster(kmock: kmock.KubernetesEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    kmock.resources[f"{GROUP}/{VERSION}/{PLURAL}"] = kmock.ResourceInfo(
        kind="InferenceService", namespaced=True, verbs={"get", "list", "patch", "create"}
    )
    url = str(kmock.url).rstrip("/")
    async with httpx.AsyncClient() as client:
        # chat: STATUS; idle: stable alone, nothing failed
        for name, status in (("chat", STATUS), ("idle", {"phase": "Ready", "stableRevision": TARGET})):
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "InferenceService",
                "metadata": {"name": name, "namespace": NAMESPACE, "resourceVersion": "1"},
                "spec": SPEC,
                "status": status,
            }
            (await client.post(f"{url}{PATH}", json=body)).raise_for_status()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "k", "cluster": {"server": url}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": NAMESPACE}}],
        "current-context": "c",
    }
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.chdir(tmp_path)  # no local `folio up` state here
    return url


async def folio(*argv: str) -> int:
    # the kubernetes client is synchronous; the emulator serves on this test's event loop
    return await asyncio.to_thread(main, list(argv))


async def test_status_json_is_the_status_object(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert await folio("status", "chat", "-o", "json") == 0
    assert json.loads(capsys.readouterr().out) == STATUS


async def test_status_table(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert await folio("status") == 0
    out = capsys.readouterr().out
    assert "chat" in out and "idle" in out and "RolledBack" in out and TARGET in out and "AnalysisFailed" in out


async def test_unknown_name_is_a_clear_error(cluster: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert await folio("status", "nope") == 1
    assert "InferenceService 'nope' not found in namespace 'ml'" in capsys.readouterr().err


@pytest.mark.parametrize("override", ["promote", "abort", "retry"])
async def test_overrides_are_annotations(
    cluster: str, override: str, kmock: kmock.KubernetesEmulator
) -> None:
    assert await folio(override, "chat") == 0
    async with httpx.AsyncClient() as client:
        obj: dict[str, Any] = (await client.get(f"{cluster}{PATH}/chat")).json()
    assert f"folio.dev/{override}" in obj["metadata"]["annotations"]
    assert obj["status"] == STATUS  # a merge patch: nothing else touched


@pytest.mark.parametrize(("override", "said"), [
    ("promote", "no canary in progress: nothing to promote"),
    ("abort", "no canary in progress: nothing to abort"),
    ("retry", f"revision {TARGET} has not failed: nothing to retry"),
])
async def test_an_override_with_nothing_to_act_on_says_so_and_fails(
    cluster: str, override: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await folio(override, "idle") == 1
    assert capsys.readouterr().err.strip() == (
        f"folio {override}: inferenceservice/idle (namespace ml): {said}; nothing was requested")
    async with httpx.AsyncClient() as client:
        obj: dict[str, Any] = (await client.get(f"{cluster}{PATH}/idle")).json()
    assert f"folio.dev/{override}" not in obj["metadata"].get("annotations", {})
