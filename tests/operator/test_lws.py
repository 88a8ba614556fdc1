"""A revision whose replica spans several pods, through the real operator: a LeaderWorkerSet planned,
readiness taken from the LeaderWorkerSet's status (groups), and a canary that is a LeaderWorkerSet of its
own rolled back by its analysis. The test plays LeaderWorkerSet's controller (its status and conditions)."""

from __future__ import annotations

from typing import Any

import pytest

from folio.operator.k8s.names import LEADER_WORKER_SET, LWS_WORKER_INDEX_LABEL
from tests.operator.harness import (
    ApiServer,
    Cluster,
    condition,
    eventually,
    isvc_manifest,
    rev_of,
    running_operator,
)
from tests.operator.test_clock import SplitLoad, router_pod

pytestmark = [pytest.mark.timeout(90), pytest.mark.kmock(cls=ApiServer)]
LWS, KIND = LEADER_WORKER_SET
GROUPS: dict[str, Any] = {"args": {"tensorParallelSize": 8, "pipelineParallelSize": 2}}  # 2 pods of 8 GPUs


def lws_status(ready: int, replicas: int) -> dict[str, Any]:
    """What LeaderWorkerSet's controller reports: groups ready, and Available once all are."""
    at = "2026-01-01T00:00:00Z"
    conditions = [{"type": "Available", "status": "True" if ready >= replicas else "False", "reason": "AllGroupsReady",
                   "message": "All replicas are ready", "lastTransitionTime": at},
                  {"type": "Progressing", "status": "False" if ready >= replicas else "True",
                   "reason": "GroupsProgressing", "message": "Replicas are progressing", "lastTransitionTime": at}]
    return {"replicas": replicas, "readyReplicas": ready, "updatedReplicas": replicas, "conditions": conditions}


async def pulled_and_planned(cluster: Cluster, rev: str, replicas: int) -> dict[str, Any]:
    """Play the pre-pull Job; the LeaderWorkerSet is asked for its groups once the weights are verified."""
    await eventually(lambda: cluster.get("batch/v1", "Job", f"chat-prepull-{rev}"), what="pre-pull Job")
    await cluster.set_status("batch/v1", "Job", f"chat-prepull-{rev}",
                             {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})

    async def scaled_up() -> dict[str, Any]:
        lws = await cluster.get(LWS, KIND, f"chat-{rev}")
        assert lws is not None and lws["spec"]["replicas"] == replicas, lws
        return lws

    return await eventually(scaled_up, what="the LeaderWorkerSet asked for its groups")


async def test_a_group_revision_is_a_leader_worker_set_ready_when_its_groups_are(cluster: Cluster) -> None:
    manifest = isvc_manifest(replicas=2, engine=GROUPS)
    rev = rev_of(manifest)
    await cluster.create_isvc(manifest)
    async with running_operator(cluster.server):
        lws = await pulled_and_planned(cluster, rev, replicas=2)
        assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert lws["spec"]["startupPolicy"] == "LeaderCreated"
        children = await cluster.children()
        assert ("Deployment", f"chat-{rev}") not in children, "a LeaderWorkerSet instead"
        assert children[("Service", f"chat-{rev}")]["spec"]["selector"][LWS_WORKER_INDEX_LABEL] == "0"
        assert ("NetworkPolicy", f"chat-{rev}-group") in children

        assert condition(await cluster.isvc(), "Ready").get("status") != "True", "no group is ready yet"

        async def groups_ready(count: int) -> bool:
            isvc = await cluster.isvc()
            [revision] = isvc["status"]["revisions"]
            assert revision.get("readyReplicas") == count, revision
            return condition(isvc, "Ready")["status"] == "True"

        # the rollout and the autoscaler count groups (LeaderWorkerSet's readyReplicas), not pods
        await cluster.set_status(LWS, KIND, f"chat-{rev}", lws_status(ready=1, replicas=2))
        await eventually(lambda: groups_ready(1), what="Ready=True with its first group ready")
        await cluster.set_status(LWS, KIND, f"chat-{rev}", lws_status(ready=2, replicas=2))
        await eventually(lambda: groups_ready(2), what="both groups ready")

        # scaled in place: fewer groups, the same LeaderWorkerSet
        await cluster.update_spec("chat", {"replicas": 1})

        async def one_group() -> bool:
            found = await cluster.get(LWS, KIND, f"chat-{rev}")
            return found is not None and found["spec"]["replicas"] == 1

        await eventually(one_group, what="spec.replicas: the LeaderWorkerSet's groups")


async def test_a_failing_canary_leader_worker_set_is_rolled_back(cluster: Cluster) -> None:
    router = await router_pod(cluster)
    rollout = {"steps": [{"weight": 50, "pause": "1h"}],
               "analysis": {"interval": "1s", "failureLimit": 2, "minRequests": 5}}
    manifest = isvc_manifest(rollout=rollout, engine=GROUPS)
    old = rev_of(manifest)
    await cluster.create_isvc(manifest)
    async with running_operator(cluster.server):
        await pulled_and_planned(cluster, old, replicas=1)
        await cluster.set_status(LWS, KIND, f"chat-{old}", lws_status(ready=1, replicas=1))

        async def ready() -> bool:
            return condition(await cluster.isvc(), "Ready")["status"] == "True"

        await eventually(ready, what="the stable revision Ready")
        async with SplitLoad(cluster, router, old, canary_error_rate=0.5) as load:
            canary_engine = {"args": {**GROUPS["args"], "maxNumSeqs": 8}}
            await cluster.update_spec("chat", {"engine": canary_engine})
            new = rev_of(isvc_manifest(rollout=rollout, engine=canary_engine))
            await pulled_and_planned(cluster, new, replicas=1)  # a LeaderWorkerSet of its own
            assert await cluster.get(LWS, KIND, f"chat-{old}") is not None
            await cluster.set_status(LWS, KIND, f"chat-{new}", lws_status(ready=1, replicas=1))
            await eventually(lambda: load.canary_served(), timeout=15, what="the canary taking traffic")
            await eventually(lambda: load.canary_gone(), timeout=30, what="the rollback")

        async def canary_removed() -> bool:
            return await cluster.get(LWS, KIND, f"chat-{new}") is None

        await eventually(canary_removed, what="the canary's LeaderWorkerSet removed, whole groups with it")
        isvc = await cluster.isvc()
        [failed] = isvc["status"]["failedRevisions"]
        assert failed["revision"] == new and failed["reason"] == "AnalysisFailed"
        assert {t["revision"]: t["weight"] for t in isvc["status"]["traffic"]} == {old: 100}
        assert await cluster.get(LWS, KIND, f"chat-{old}") is not None, "stable keeps serving"
