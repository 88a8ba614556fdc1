"""The real operator against kmock's Kubernetes emulator: create, scale, new revision, delete, restart."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY

from folio.operator.controller import metrics
from tests.operator.harness import (
    NAMESPACE,
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


async def test_create_makes_every_child_and_reports_ready(cluster: Cluster) -> None:
    manifest = isvc_manifest(engine={"args": {"maxModelLen": 2048}})
    rev = rev_of(manifest)
    async with running_operator(cluster.server):
        await cluster.create_isvc(manifest)

        async def all_children() -> dict[tuple[str, str], Any]:
            children = await cluster.children()
            return children if len(children) == 11 else {}

        children = await eventually(all_children, what="all 11 children")
        assert set(children) == {
            ("Deployment", f"chat-{rev}"), ("Service", f"chat-{rev}"), ("Job", f"chat-prepull-{rev}"),
            ("PersistentVolumeClaim", "chat-weights"), ("Deployment", "chat"), ("Service", "chat"),
            ("ServiceAccount", "chat-router"), ("RoleBinding", "chat-router"),
            ("PodDisruptionBudget", "chat-engine"), ("PodDisruptionBudget", "chat-router"),
            ("NetworkPolicy", "chat-engine"),
        }
        for obj in children.values():
            (owner,) = obj["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
                "InferenceService", "chat", "uid-chat", True)
        engine = children[("Deployment", f"chat-{rev}")]
        assert engine["spec"]["replicas"] == 0, "no serving pod before the weights are verified"
        container = engine["spec"]["template"]["spec"]["containers"][0]
        assert container["startupProbe"]["httpGet"]["path"] == "/health"
        assert "--max-model-len" in container["args"] and "--digest" in container["args"]

        async def status_written() -> dict[str, Any] | None:
            isvc = await cluster.isvc()
            return isvc if isvc.get("status", {}).get("observedGeneration") == 1 else None

        isvc = await eventually(status_written, what="status for generation 1")
        assert isvc["metadata"]["finalizers"] == ["folio.dev/finalizer"]
        assert condition(isvc, "Ready")["status"] == "False"
        assert condition(isvc, "WeightsReady")["status"] == "False"

        # Weights verified, a replica ready: Ready, 100% of traffic on the revision.
        await cluster.set_status("batch/v1", "Job", f"chat-prepull-{rev}",
                                 {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})

        async def pulled() -> bool:
            children = await cluster.children()
            return ("Job", f"chat-prepull-{rev}") not in children and (
                children[("Deployment", f"chat-{rev}")]["spec"]["replicas"] == 1)

        await eventually(pulled, what="Job removed and engine scaled to 1")
        first_ready = condition(await cluster.isvc(), "Ready")
        await cluster.set_status("apps/v1", "Deployment", f"chat-{rev}", {"readyReplicas": 1, "replicas": 1})

        async def ready() -> dict[str, Any] | None:
            isvc = await cluster.isvc()
            return isvc if condition(isvc, "Ready")["status"] == "True" else None

        isvc = await eventually(ready, what="Ready=True")
        status = isvc["status"]
        assert status["stableRevision"] == rev
        assert status["traffic"] == [{"revision": rev, "weight": 100}]
        assert condition(isvc, "WeightsReady")["status"] == "True"
        assert condition(isvc, "Ready")["lastTransitionTime"] >= first_ready["lastTransitionTime"]
        assert await eventually(lambda: cluster.events("Serving"), what="a Serving Event")
        (created,) = await cluster.events("Created")  # one Event for the pass that made the children
        assert f"Deployment/chat-{rev}" in created["message"]
        assert created["involvedObject"]["name"] == "chat" and created["type"] == "Normal"

        ok = REGISTRY.get_sample_value("folio_operator_reconciles_total", {"trigger": "create", "result": "ok"})
        assert ok is not None and ok >= 1

        # Further passes of the timer change nothing: conditions keep their transition times.
        before = (await cluster.isvc())["status"]["conditions"]
        cluster.tick_mark = None  # type: ignore[attr-defined]
        await eventually(lambda: _ticks(cluster, 3), what="three more timer passes")
        assert (await cluster.isvc())["status"]["conditions"] == before


async def _ticks(cluster: Cluster, n: int) -> bool:
    """True once the timer has run `n` more passes than at the first call (read from the metrics)."""
    passes = sum(REGISTRY.get_sample_value("folio_operator_reconciles_total", {"trigger": "timer", "result": r}) or 0
                 for r in ("ok", "invalid", "error", "gone"))
    marker = getattr(cluster, "tick_mark", None)
    if marker is None:
        cluster.tick_mark = passes  # type: ignore[attr-defined]
        return False
    return passes - marker >= n


async def test_replicas_scale_in_place_and_args_make_a_new_revision(cluster: Cluster) -> None:
    manifest = isvc_manifest()
    async with running_operator(cluster.server):
        rev = await bring_up(cluster, manifest)

        await cluster.update_spec("chat", {"replicas": 3})

        async def scaled() -> bool:
            dep = await cluster.get("apps/v1", "Deployment", f"chat-{rev}")
            return dep is not None and dep["spec"]["replicas"] == 3

        await eventually(scaled, what="engine scaled to 3 in place")
        engines = [k for k in await cluster.children() if k[0] == "Deployment" and k[1] != "chat"]
        assert engines == [("Deployment", f"chat-{rev}")], "replicas must not make a new revision"

        async def observed_generation_2() -> bool:
            return (await cluster.isvc())["status"]["observedGeneration"] == 2

        await eventually(observed_generation_2, what="observedGeneration 2")

        await cluster.update_spec("chat", {"engine": {"args": {"maxNumSeqs": 8}}})
        new_rev = rev_of(isvc_manifest(replicas=3, engine={"args": {"maxNumSeqs": 8}}))
        assert new_rev != rev

        async def new_revision_planned() -> bool:
            children = await cluster.children()
            return {("Deployment", f"chat-{new_rev}"), ("Job", f"chat-prepull-{new_rev}"),
                    ("Service", f"chat-{new_rev}")} <= set(children)

        await eventually(new_revision_planned, what="new revision objects")
        new_engine = await cluster.get("apps/v1", "Deployment", f"chat-{new_rev}")
        assert new_engine is not None
        assert "--max-num-seqs" in new_engine["spec"]["template"]["spec"]["containers"][0]["args"]
        old_engine = await cluster.get("apps/v1", "Deployment", f"chat-{rev}")
        assert old_engine is not None and old_engine["spec"]["replicas"] == 3, "stable keeps serving"
        isvc = await cluster.isvc()
        assert isvc["status"]["canaryRevision"] == new_rev
        assert isvc["status"]["traffic"] == [{"revision": rev, "weight": 100}]

        # The canary's weights verified and a replica ready: it takes the first step's share.
        await cluster.set_status("batch/v1", "Job", f"chat-prepull-{new_rev}", {"succeeded": 1})
        await cluster.set_status("apps/v1", "Deployment", f"chat-{new_rev}", {"readyReplicas": 1})

        async def first_step() -> list[dict[str, Any]] | None:
            traffic = (await cluster.isvc())["status"]["traffic"]
            return traffic if len(traffic) == 2 else None

        traffic = await eventually(first_step, what="canary traffic")
        assert traffic == [{"revision": rev, "weight": 95}, {"revision": new_rev, "weight": 5}]
        canary = await cluster.get("apps/v1", "Deployment", f"chat-{new_rev}")
        assert canary is not None and canary["spec"]["replicas"] == 3


async def test_delete_removes_children_and_releases_the_finalizer(cluster: Cluster) -> None:
    manifest = isvc_manifest()
    async with running_operator(cluster.server):
        await bring_up(cluster, manifest)
        assert await cluster.children()
        await cluster.delete_isvc("chat")

        async def gone() -> bool:
            isvc = await cluster.get(manifest["apiVersion"], "InferenceService", "chat")
            return isvc is None and not await cluster.children()

        await eventually(gone, what="children deleted and the InferenceService released")


async def test_restart_mid_reconcile_converges_without_duplicates(cluster: Cluster) -> None:
    manifest = isvc_manifest()
    rev = rev_of(manifest)
    async with running_operator(cluster.server):
        await cluster.create_isvc(manifest)
        # Stop as soon as the first child appears: the pass that creates them is still going.
        await eventually(cluster.children, timeout=10, what="a first child")
    partial = await cluster.children()
    async with running_operator(cluster.server):

        async def converged() -> dict[tuple[str, str], Any]:
            children = await cluster.children()  # asserts there are no duplicates
            return children if len(children) == 11 else {}

        children = await eventually(converged, what="the full set of children")
        assert set(partial) <= set(children)
        assert ("Deployment", f"chat-{rev}") in children
        isvc = await cluster.isvc()
        assert isvc["status"]["stableRevision"] == rev
        assert isvc["metadata"]["finalizers"] == ["folio.dev/finalizer"]


async def test_unknown_engine_arg_is_reported_not_crashed(cluster: Cluster) -> None:
    manifest = isvc_manifest(engine={"args": {"maxModelLenght": 4096}})
    async with running_operator(cluster.server):
        await cluster.create_isvc(manifest)

        async def degraded() -> dict[str, Any] | None:
            isvc = await cluster.isvc()
            conditions = isvc.get("status", {}).get("conditions", [])
            return next((c for c in conditions if c["type"] == "Degraded" and c["status"] == "True"), None)

        cond = await eventually(degraded, what="Degraded=True")
        assert cond["reason"] == "InvalidEngineArgs"
        assert "unknown engine arg 'maxModelLenght'" in cond["message"]
        assert cond["observedGeneration"] == 1
        await eventually(lambda: cluster.events("InvalidEngineArgs"), what="a Warning Event")
        await eventually(lambda: _ticks(cluster, 3), what="three more timer passes")
        # No engine was planned, the operator is alive, and the Event was posted once, not per pass.
        assert not any(kind == "Deployment" and name != "chat" for kind, name in await cluster.children())
        assert len(await cluster.events("InvalidEngineArgs")) == 1

        # Fixing the spec recovers without a restart.
        await cluster.update_spec("chat", {"engine": {"args": {"maxModelLenght": None, "maxModelLen": 4096}}})
        fixed = rev_of(isvc_manifest(engine={"args": {"maxModelLen": 4096}}))
        await eventually(lambda: cluster.get("apps/v1", "Deployment", f"chat-{fixed}"), what="engine planned")

        async def recovered() -> bool:
            return condition(await cluster.isvc(), "Degraded")["status"] == "False"

        await eventually(recovered, what="Degraded=False")


async def test_retry_after_failed_weights_pulls_them_again(cluster: Cluster) -> None:
    manifest = isvc_manifest()
    rev = rev_of(manifest)
    job_name = f"chat-prepull-{rev}"
    async with running_operator(cluster.server):
        await cluster.create_isvc(manifest)
        await eventually(lambda: cluster.get("batch/v1", "Job", job_name), what="pre-pull Job")
        await cluster.set_status("batch/v1", "Job", job_name, {"failed": 3, "conditions": [
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "digest mismatch"}]})

        async def weights_failed() -> bool:
            status = (await cluster.isvc()).get("status", {})
            return any(f["revision"] == rev and f["reason"] == "WeightsFailed"
                       for f in status.get("failedRevisions", []))

        failures = metrics.REVISIONS_FAILED.labels(namespace=NAMESPACE, isvc="chat", reason="WeightsFailed")
        before = failures._value.get()
        await eventually(weights_failed, what="the revision failed on its weights")
        assert failures._value.get() == before + 1  # what FolioCanaryRolledBack alerts on

        # `folio retry chat` sets this annotation; the old Job must go so the pull runs afresh
        await cluster.call(cluster.kube.merge_patch, "serving.folio.dev/v1alpha1", "InferenceService", NAMESPACE,
                           "chat", {"metadata": {"annotations": {"folio.dev/retry": "1"}}})

        async def pulled_again() -> dict[str, Any] | None:
            job = await cluster.get("batch/v1", "Job", job_name)
            return job if job is not None and not (job.get("status") or {}).get("conditions") else None

        await eventually(pulled_again, what="a fresh pre-pull Job in place of the failed one")

        async def retry_cleared() -> bool:  # the pass that made the Job clears the annotation after it
            isvc = await cluster.isvc()
            return "folio.dev/retry" not in (isvc["metadata"].get("annotations") or {})

        await eventually(retry_cleared, what="the retry annotation cleared once acted on")
        await cluster.set_status("batch/v1", "Job", job_name,
                                 {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})

        async def weights_ready() -> bool:
            conditions = (await cluster.isvc()).get("status", {}).get("conditions", [])
            return any(c["type"] == "WeightsReady" and c["status"] == "True" for c in conditions)

        await eventually(weights_ready, what="WeightsReady=True after the retry")
