"""Read what the cluster says about an InferenceService's revisions, as `rollout.Observed` facts.

The pure parts (`job_weights`, `ready_replicas`, `crash_looping`) read one object each and are
unit-tested; `observe` fetches the objects. Weights already verified in status are not looked up
again: the pre-pull Job is gone once they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal

from folio.operator.kube import Kube, Obj
from folio.operator.planner import component_labels, engine_name
from folio.operator.prepull import prepull_job_name
from folio.operator.rollout import OVERRIDES, Observed, RevisionFacts
from folio.operator.spec import DOMAIN, InferenceServiceSpec, InferenceServiceStatus, revision_name

WeightsState = Literal["pending", "ready", "failed"]


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


def ready_replicas(deployment: Obj | None) -> int:
    if deployment is None:
        return 0
    return int((deployment.get("status") or {}).get("readyReplicas") or 0)


def crash_looping(pods: Sequence[Obj]) -> bool:
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if ((cs.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff":
                return True
    return False


def overrides(annotations: Mapping[str, str]) -> frozenset[str]:
    """The manual overrides asked for with `folio.dev/<name>` annotations."""
    return frozenset(name for name in OVERRIDES if f"{DOMAIN}/{name}" in annotations)


def observe(
    kube: Kube,
    namespace: str,
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
    facts = {name: _revision_facts(kube, namespace, isvc, name, status) for name in names}
    return Observed(now=now, revisions=facts, overrides=overrides(annotations))


def _revision_facts(kube: Kube, namespace: str, isvc: str, rev: str, status: InferenceServiceStatus) -> RevisionFacts:
    known = status.revision(rev)
    weights: WeightsState
    if known is not None and known.weights_ready:
        weights, message = "ready", ""
    else:
        job = kube.get("batch/v1", "Job", namespace, prepull_job_name(isvc, rev))
        failed = job is not None and _condition(job, "Failed") is not None
        pods = kube.list("v1", "Pod", namespace, component_labels(isvc, "prepull", rev)) if failed else []
        weights, message = job_weights(job, pods)
    deployment = kube.get("apps/v1", "Deployment", namespace, engine_name(isvc, rev))
    replicas = ready_replicas(deployment)
    pods = kube.list("v1", "Pod", namespace, component_labels(isvc, "engine", rev)) if deployment else []
    return RevisionFacts(
        weights=weights,
        weights_message=message,
        ready_replicas=replicas,
        crash_looping=crash_looping(pods),
    )


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
