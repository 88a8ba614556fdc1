"""The rollout's facts from an InferenceService's children, as `rollout.Observed`.

The pure parts (`job_weights`, `ready_replicas`, `crash_looping`, `router_metrics_urls`) read one
object each and are unit-tested; `observe` reads the children the indexes hold. A revision's engines are
a Deployment or, when a replica spans several pods, a LeaderWorkerSet (`folio.operator.serving.lws`): its
``readyReplicas`` counts groups whose every pod is ready, so the rollout and the autoscaler count groups,
and only a group's leader (worker index 0) serves, so only leaders are engines to call or scrape. Weights already
verified in status are not looked up again: the pre-pull Job is gone once they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal

from folio.operator.controller.children import Children, Obj
from folio.operator.k8s.names import (
    ADAPTERS_GATE,
    ENGINE_PORT,
    LEADER_WORKER_SET,
    LWS_WORKER_INDEX_LABEL,
    ROUTER_PORT,
    component_labels,
    engine_name,
    override_annotation,
    prepull_job_name,
)
from folio.operator.rollout import OVERRIDES, Observed, RevisionFacts
from folio.operator.serving.plan import RUNNING_ROLES
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus, revision_name

WeightsState = Literal["pending", "ready", "failed"]


def observe(
    children: Children,
    isvc: str,
    spec: InferenceServiceSpec,
    status: InferenceServiceStatus,
    annotations: Mapping[str, str],
    now: datetime,
) -> Observed:
    names = [r.name for r in status.revisions if r.role != "Failed"]
    target = revision_name(spec)
    if target not in names and not any(f.revision == target for f in status.failed_revisions):
        names.append(target)
    facts = {name: _revision_facts(children, isvc, name, status) for name in names}
    return Observed(now=now, revisions=facts, overrides=overrides(annotations))


def _revision_facts(children: Children, isvc: str, rev: str, status: InferenceServiceStatus) -> RevisionFacts:
    known = status.revision(rev)
    weights: WeightsState
    if known is not None and known.weights_ready:
        weights, message = "ready", ""
    else:
        weights, message = prepull_weights(children, isvc, rev)
    workload = engine_workload(children, isvc, rev)
    pods = children.pods_with(component_labels(isvc, "engine", rev)) if workload else []
    return RevisionFacts(
        weights=weights,
        weights_message=message,
        ready_replicas=ready_replicas(workload),
        crash_looping=crash_looping(pods),
    )


def engine_workload(children: Children, isvc: str, rev: str) -> Obj | None:
    """The revision's Deployment or LeaderWorkerSet (the same name: the plan makes one or the other)."""
    name = engine_name(isvc, rev)
    return children.get("apps/v1", "Deployment", name) or children.get(*LEADER_WORKER_SET, name)


def group_worker(pod: Obj) -> bool:
    """A LeaderWorkerSet's worker pod: its ranks only, no HTTP (the leader serves for the group)."""
    index = ((pod.get("metadata") or {}).get("labels") or {}).get(LWS_WORKER_INDEX_LABEL)
    return index is not None and index != "0"


def prepull_weights(children: Children, isvc: str, rev: str) -> tuple[WeightsState, str]:
    """Where the pre-pull Job of a revision (or an adapter revision) stands."""
    job = children.get("batch/v1", "Job", prepull_job_name(isvc, rev))
    failed = job is not None and _condition(job, "Failed") is not None
    pods = children.pods_with(component_labels(isvc, "prepull", rev)) if failed else []
    return job_weights(job, pods)


def engine_pods(children: Children, isvc: str, rev: str | None = None) -> list[Obj]:
    """The engine pods of a revision (None: of every revision) whose containers are ready (``ContainersReady``:
    the engine answers), whether or not the pod is Ready: its adapters readiness gate (`ADAPTERS_GATE`) waits
    on what they load."""
    return [p for p in children.pods_with(component_labels(isvc, "engine", rev))
            if not (p.get("metadata") or {}).get("deletionTimestamp") and pod_host(p) and not group_worker(p)
            and _condition(p, "ContainersReady") is not None]  # fmt: skip


def gated(pod: Obj) -> bool:
    """The pod waits on `ADAPTERS_GATE` (its Deployment serves adapters)."""
    return any(g.get("conditionType") == ADAPTERS_GATE for g in (pod.get("spec") or {}).get("readinessGates") or [])


def gate_patch(pod: Obj, holding: bool, now: str) -> list[Obj]:
    """The JSON patch that sets the pod's `ADAPTERS_GATE` condition to ``holding`` (empty: it says so already);
    guarded by a test of the condition's place, so a pod whose conditions moved meanwhile is refused (422)."""
    want = "True" if holding else "False"
    conditions = (pod.get("status") or {}).get("conditions") or []
    at = next((i for i, c in enumerate(conditions) if c.get("type") == ADAPTERS_GATE), None)
    if at is not None and conditions[at].get("status") == want:
        return []
    value = {"type": ADAPTERS_GATE, "status": want, "lastTransitionTime": now,
             "reason": "AdaptersLoaded" if holding else "AdaptersLoading"}
    if at is None:
        return [{"op": "add", "path": "/status/conditions/-", "value": value}]
    return [{"op": "test", "path": f"/status/conditions/{at}/type", "value": ADAPTERS_GATE},
            {"op": "replace", "path": f"/status/conditions/{at}", "value": value}]


def overrides(annotations: Mapping[str, str]) -> frozenset[str]:
    """The manual overrides asked for with `folio.dev/<name>` annotations, and with `folio.dev/<name>-adapter`
    for one adapter (``<name>@<adapter>``)."""
    base = {name for name in OVERRIDES if override_annotation(name) in annotations}
    adapters = {f"{name}@{annotations[key]}" for name in OVERRIDES
                if (key := override_annotation(f"{name}@-")) in annotations and annotations[key]}
    return frozenset(base | adapters)


def job_weights(job: Obj | None, pods: Sequence[Obj] = ()) -> tuple[WeightsState, str]:
    """(pending|ready|failed, message) from a pre-pull Job and its pods."""
    if job is None:
        return "pending", "pre-pull not started"
    if (job.get("metadata") or {}).get("deletionTimestamp"):  # an old attempt going away (retry): a new one follows
        return "pending", "previous pre-pull is being removed"
    status = job.get("status") or {}
    if status.get("succeeded", 0) >= 1 or _condition(job, "Complete"):
        return "ready", ""
    failed = _condition(job, "Failed")
    if failed is not None:
        detail = _termination_message(pods) or failed.get("message") or failed.get("reason") or "pre-pull failed"
        return "failed", detail
    attempts = status.get("failed", 0)
    return "pending", f"pre-pull running (attempt {attempts + 1})" if status.get("active") else "pre-pull pending"


def ready_replicas(workload: Obj | None) -> int:
    """A Deployment's ready pods, or a LeaderWorkerSet's ready groups (the same field)."""
    if workload is None:
        return 0
    return int((workload.get("status") or {}).get("readyReplicas") or 0)


def crash_looping(pods: Sequence[Obj]) -> bool:
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff":
                return True
    return False


def router_metrics_urls(pods: Sequence[Obj]) -> list[str]:
    """`/metrics` of every running router pod, at its `http` container port."""
    urls = []
    for pod in pods:
        status = pod.get("status") or {}
        host = pod_host(pod)
        if status.get("phase") != "Running" or not host or (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        port = ROUTER_PORT
        for container in (pod.get("spec") or {}).get("containers") or []:
            for p in container.get("ports") or []:
                if p.get("name") == "http":
                    port = int(p["containerPort"])
        urls.append(f"http://{host}:{port}/metrics")
    return sorted(urls)


def engine_capacity(children: Children, isvc: str, status: InferenceServiceStatus) -> tuple[int, int, list[str]]:
    """Of the running revisions' engines: ready replicas, replicas asked for and not ready yet (Pending,
    pulling the image, loading weights), and the `/metrics` of the ready pods (Waiting and KVCache)."""
    ready = starting = 0
    urls: list[str] = []
    for rev in status.revisions:
        if rev.role not in RUNNING_ROLES:
            continue
        workload = engine_workload(children, isvc, rev.name)
        if workload is None:
            continue
        up = ready_replicas(workload)  # groups, for a LeaderWorkerSet: the replicas the autoscaler counts
        ready += up
        starting += max(0, int((workload.get("spec") or {}).get("replicas") or 0) - up)
        pods = [p for p in children.pods_with(component_labels(isvc, "engine", rev.name))
                if pod_ready(p) and not group_worker(p)]
        urls += [f"http://{pod_host(p)}:{engine_metrics_port(p)}/metrics" for p in pods if pod_host(p)]
    return ready, starting, sorted(urls)


def engine_metrics_port(pod: Obj) -> int:
    """Where an engine pod serves /metrics: its `metrics` container port (`--metrics-port`), or the API port
    for a pod started before engines had one."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for p in container.get("ports") or []:
            if p.get("name") == "metrics":
                return int(p["containerPort"])
    return ENGINE_PORT


def pod_ready(pod: Obj) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def pod_host(pod: Obj) -> str:
    """A pod's IP as a URL host ("" before it has one)."""
    ip = (pod.get("status") or {}).get("podIP") or ""
    return f"[{ip}]" if ":" in ip else ip


def _condition(obj: Obj, type_: str) -> Obj | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_ and cond.get("status") == "True":
            return cond
    return None


def _termination_message(pods: Sequence[Obj]) -> str:
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            message = ((cs.get("state") or {}).get("terminated") or {}).get("message")
            if message:
                return " ".join(message.strip().splitlines()[-3:])
    return ""
