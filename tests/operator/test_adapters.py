"""Adapters in the real operator (kopf against kmock), the engine pods served over HTTP by the engine's own app
on fake engines: an adapter revision is pre-pulled by a Job of its own, loaded into every running engine pod
through the runtime endpoints (no new base revision, no pod replaced), and a pod is put in rotation by its
adapters readiness gate only once it holds what takes traffic; a new revision of the adapter is a canary of
that adapter alone, and a removed adapter is unloaded."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from folio.engine.lora import LoRARequest
from folio.operator.k8s.names import ADAPTERS_GATE, component_labels
from folio.operator.serving.adapters import engine_name
from folio.operator.spec import InferenceServiceSpec, adapter_revision_name
from tests.operator.harness import (
    COMMIT,
    NAMESPACE,
    ApiServer,
    Cluster,
    condition,
    eventually,
    isvc_manifest,
    rev_of,
    running_operator,
)
from tests.server.conftest import serving_fake
from tests.server.fake_engine import FakeEngine

pytestmark = [pytest.mark.timeout(90), pytest.mark.kmock(cls=ApiServer)]

ROLLOUT = {"steps": [{"weight": 50, "pause": "1s"}], "analysis": {"interval": "1s", "minRequests": 1},
           "drainPeriod": "1s"}


class PodEngine(FakeEngine):
    """A fake engine pod: the adapter folders it is told to load are in the pod's cache volume, not here."""

    def add_lora(self, request: LoRARequest) -> None:
        self.loras[request.lora_name] = request


def adapter(name: str, commit: str) -> dict[str, Any]:
    return {"name": name, "source": f"hf://acme/{name}-lora", "revision": commit, "rollout": ROLLOUT}


def manifest(*adapters: dict[str, Any]) -> dict[str, Any]:
    return isvc_manifest(engine={"args": {"enableLora": True}}, adapters=list(adapters), rollout=ROLLOUT)


def adapter_rev(m: dict[str, Any], name: str) -> str:
    spec = InferenceServiceSpec.model_validate(m["spec"])
    return adapter_revision_name(next(a for a in spec.adapters if a.name == name))


@contextlib.contextmanager
def engine_pod() -> Iterator[tuple[PodEngine, str]]:
    engine = PodEngine(enable_lora=True)
    with serving_fake(engine, enable_lora=True, allow_runtime_lora_updating=True) as running:
        yield engine, running.url


async def complete_job(cluster: Cluster, rev: str) -> dict[str, Any]:
    job = await eventually(lambda: cluster.get("batch/v1", "Job", f"chat-prepull-{rev}"), what=f"pre-pull {rev}")
    await cluster.set_status("batch/v1", "Job", f"chat-prepull-{rev}",
                             {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
    return job


async def start_pod(cluster: Cluster, rev: str) -> str:
    """Play kubelet: one engine pod of ``rev`` whose container is ready (the gate decides the rest)."""
    name = pod_name(rev)
    await cluster.call(cluster.kube.create, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": component_labels("chat", "engine", rev)},
        "spec": {"containers": [{"name": "engine", "image": "folio:test"}],
                 "readinessGates": [{"conditionType": ADAPTERS_GATE}]},
        "status": {"phase": "Running", "podIP": "10.0.0.7",
                   "conditions": [{"type": "ContainersReady", "status": "True"}]},
    })  # fmt: skip
    return name


def pod_name(rev: str) -> str:
    return f"chat-{rev}-pod0"


async def gate(cluster: Cluster, pod: str) -> str | None:
    found = await cluster.get("v1", "Pod", pod)
    conditions = ((found or {}).get("status") or {}).get("conditions") or []
    return next((c["status"] for c in conditions if c["type"] == ADAPTERS_GATE), None)


def adapter_status(isvc: dict[str, Any], name: str) -> dict[str, Any]:
    return next((a for a in isvc.get("status", {}).get("adapters", []) if a["name"] == name), {})


async def test_an_adapter_is_pre_pulled_loaded_into_running_pods_and_gates_their_readiness(cluster: Cluster) -> None:
    first = manifest(adapter("sql", COMMIT))
    base, sql1 = rev_of(first), adapter_rev(first, "sql")
    with engine_pod() as (engine, url):
        async with running_operator(cluster.server, engine_url=lambda pod: url):
            await cluster.create_isvc(first)
            await complete_job(cluster, base)
            deployment = await eventually(lambda: cluster.get("apps/v1", "Deployment", f"chat-{base}"),
                                          what="the engine Deployment")
            pod_spec = deployment["spec"]["template"]["spec"]
            assert pod_spec["readinessGates"] == [{"conditionType": ADAPTERS_GATE}]
            assert "--enable-lora" in pod_spec["containers"][0]["args"]
            assert "--allow-runtime-lora-updating" in pod_spec["containers"][0]["args"]
            job = await complete_job(cluster, sql1)
            args = job["spec"]["template"]["spec"]["containers"][0]["args"]
            assert args[args.index("--dest") + 1] == f"/weights/adapters/{sql1}/sql-lora"
            assert args[args.index("--revision") + 1] == COMMIT
            pod = await start_pod(cluster, base)
            await eventually(lambda: _true(gate(cluster, pod)), what="the gate True: nothing takes traffic yet")
            await cluster.set_status("apps/v1", "Deployment", f"chat-{base}", {"readyReplicas": 1, "replicas": 1})

            await eventually(lambda: _holds(engine, engine_name("sql", sql1)), what="sql loaded into the pod")
            assert engine.loras[engine_name("sql", sql1)].lora_path == f"/weights/adapters/{sql1}/sql-lora"

            async def serving() -> dict[str, Any] | None:
                isvc = await cluster.isvc()
                return isvc if adapter_status(isvc, "sql").get("traffic") == [{"revision": sql1, "weight": 100}] \
                    else None

            isvc = await eventually(serving, 20, "sql serving")
            assert isvc["status"]["traffic"] == [{"revision": base, "weight": 100}]
            assert condition(isvc, "Ready")["status"] == "True"

            # a second adapter: its own Job, loaded into the same pod; the base revision and its pod stay
            second = manifest(adapter("sql", COMMIT), adapter("chat-helper", "1" * 40))
            helper = adapter_rev(second, "chat-helper")
            assert rev_of(second) == base
            await cluster.update_spec("chat", {"adapters": second["spec"]["adapters"]})
            await complete_job(cluster, helper)
            await eventually(lambda: _holds(engine, engine_name("chat-helper", helper)), what="the second loaded")
            assert (await cluster.get("apps/v1", "Deployment", f"chat-{base}"))["spec"]["template"] == \
                deployment["spec"]["template"], "no pod replaced"

            # the first adapter removed: unloaded from the pod, gone from status
            await cluster.update_spec("chat", {"adapters": [second["spec"]["adapters"][1]]})
            await eventually(lambda: _gone(engine, engine_name("sql", sql1)), what="sql unloaded")
            isvc = await cluster.isvc()
            assert [a["name"] for a in isvc["status"]["adapters"]] == ["chat-helper"]
            assert await gate(cluster, pod) == "True"


async def test_a_pod_that_lacks_an_adapter_with_traffic_leaves_rotation_until_it_loads_it(cluster: Cluster) -> None:
    first = manifest(adapter("sql", COMMIT))
    sql1 = adapter_rev(first, "sql")
    with engine_pod() as (engine, url):
        async with running_operator(cluster.server, engine_url=lambda pod: url):
            pod = await serving_sql(cluster, first)
            # the engine loses the adapter (as a restarted one has none): the operator loads it again
            async with httpx.AsyncClient(trust_env=False) as client:
                resp = await client.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": engine_name("sql", sql1)})
                assert resp.status_code == 200
            await eventually(lambda: _holds(engine, engine_name("sql", sql1)), 20, "sql loaded again")
            await eventually(lambda: _true(gate(cluster, pod)), what="back in rotation")


async def serving_sql(cluster: Cluster, first: dict[str, Any]) -> str:
    """``first`` created and played until its adapter serves on one engine pod; that pod's name."""
    base, sql = rev_of(first), adapter_rev(first, "sql")
    await cluster.create_isvc(first)
    await complete_job(cluster, base)
    await complete_job(cluster, sql)
    pod = await start_pod(cluster, base)
    await cluster.set_status("apps/v1", "Deployment", f"chat-{base}", {"readyReplicas": 1, "replicas": 1})
    await eventually(lambda: _adapter_serves(cluster, "sql"), 20, "sql serving")
    return pod


async def _true(status: Any) -> bool:
    return (await status) == "True"


async def _holds(engine: FakeEngine, name: str) -> bool:
    return name in engine.loras


async def _gone(engine: FakeEngine, name: str) -> bool:
    return name not in engine.loras


async def _adapter_serves(cluster: Cluster, name: str) -> bool:
    return bool(adapter_status(await cluster.isvc(), name).get("traffic"))


async def test_promote_adapter_annotation_promotes_that_adapters_canary(cluster: Cluster) -> None:
    first = manifest(adapter("sql", COMMIT))
    base, sql1 = rev_of(first), adapter_rev(first, "sql")
    with engine_pod() as (engine, url):
        async with running_operator(cluster.server, engine_url=lambda pod: url):
            await serving_sql(cluster, first)
            second = manifest(adapter("sql", "2" * 40))
            sql2 = adapter_rev(second, "sql")
            await cluster.update_spec("chat", {"adapters": second["spec"]["adapters"]})
            await complete_job(cluster, sql2)

            async def canary_step() -> bool:
                return adapter_status(await cluster.isvc(), "sql").get("traffic") == [
                    {"revision": sql1, "weight": 50}, {"revision": sql2, "weight": 50}]

            await eventually(canary_step, 20, "sql's canary at its step (no router: no analysis to pass it)")
            assert engine_name("sql", sql2) in engine.loras and engine_name("sql", sql1) in engine.loras
            patch = {"metadata": {"annotations": {"folio.dev/promote-adapter": "sql"}}}
            await cluster.call(cluster.kube.merge_patch, "serving.folio.dev/v1alpha1", "InferenceService", NAMESPACE,
                               "chat", patch)

            async def promoted() -> dict[str, Any] | None:
                isvc = await cluster.isvc()
                sql = adapter_status(isvc, "sql")
                return isvc if sql.get("traffic") == [{"revision": sql2, "weight": 100}] else None

            isvc = await eventually(promoted, 20, "the promote-adapter annotation acted on")
            assert "folio.dev/promote-adapter" not in isvc["metadata"].get("annotations", {})
            assert isvc["status"]["traffic"] == [{"revision": base, "weight": 100}]
            await eventually(lambda: _gone(engine, engine_name("sql", sql1)), 20, "the old revision unloaded")


async def test_a_new_base_revision_loads_every_adapter_before_it_takes_traffic(cluster: Cluster) -> None:
    first = manifest(adapter("sql", COMMIT))
    base, sql1 = rev_of(first), adapter_rev(first, "sql")
    newer = isvc_manifest(engine={"args": {"enableLora": True, "maxNumSeqs": 8}}, adapters=first["spec"]["adapters"],
                          rollout=ROLLOUT)
    canary = rev_of(newer)
    with engine_pod() as (old_engine, old_url), engine_pod() as (new_engine, new_url):
        urls = {pod_name(base): old_url, pod_name(canary): new_url}
        async with running_operator(cluster.server, engine_url=lambda pod: urls[pod["metadata"]["name"]]):
            await serving_sql(cluster, first)
            await cluster.update_spec("chat", {"engine": newer["spec"]["engine"]})
            await complete_job(cluster, canary)
            assert await cluster.get("batch/v1", "Job", f"chat-prepull-{sql1}") is None, "no second pull of sql"
            pod = await start_pod(cluster, canary)
            await eventually(lambda: _true(gate(cluster, pod)), 20, "the canary's pod in rotation")
            assert engine_name("sql", sql1) in new_engine.loras, "it held sql before it could take a request"
            assert engine_name("sql", sql1) in old_engine.loras
