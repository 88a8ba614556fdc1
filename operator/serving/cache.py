"""The weights cache in a cluster: its PVC, and the pre-pull Job that fills it for one revision (or adapter
revision: ``/weights/adapters/{rev}/<name>``, `folio.operator.serving.adapters`).

``{isvc}-weights`` holds one folder per revision, ``/weights/{rev}/<model>`` where the engine pods
mount it read-only (and ``/weights/{rev}-draft/<model>``, its draft model, when it has one); while a
revision's weights are not verified, the Job ``{isvc}-prepull-{rev}``
runs `python -m folio.operator.prepull` (fetch and verify) with the cache mounted read-write. The
hub token, when there is one, reaches this Job only.
"""

from __future__ import annotations

from typing import Any

from folio.operator.k8s.names import cache_pvc_name, component_labels, prepull_job_name
from folio.operator.prepull import (
    CACHE_MOUNT,
    DRAFT_TOKEN_ENV,
    SOURCE_MOUNT,
    DraftPull,
    pvc_claim_and_path,
    weights_path,
)
from folio.operator.serving.security import harden
from folio.operator.spec import CacheSpec, ModelSource, PinnedSource

Obj = dict[str, Any]

PREPULL_SCRATCH = "1Gi"  # the hub client's own cache and locks; the weights go straight to the PVC


def weights_pvc(
    isvc: str,
    namespace: str,
    cache: CacheSpec,
    *,
    access_modes: tuple[str, ...] = ("ReadWriteOnce",),
    owner: Obj | None = None,
) -> Obj:
    """The cache PVC ``{isvc}-weights``.

    ReadWriteOnce suits one node (and kind); engine replicas spread over several nodes need a
    class that offers ReadWriteMany, passed in ``access_modes``.
    """
    spec: Obj = {"accessModes": list(access_modes), "resources": {"requests": {"storage": cache.size}}}
    if cache.storage_class_name:
        spec["storageClassName"] = cache.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(cache_pvc_name(isvc), namespace, component_labels(isvc, "cache"), owner),
        "spec": spec,
    }


def prepull_job(
    isvc: str,
    namespace: str,
    rev: str,
    model: ModelSource,
    *,
    image: str,
    owner: Obj | None = None,
    backoff_limit: int = 2,
    dest: str | None = None,
    parallel: tuple[int, int] = (1, 1),
    draft: DraftPull | None = None,
) -> Obj:
    """The Job ``{isvc}-prepull-{rev}`` that fills ``/weights/{rev}`` in the cache PVC and verifies it
    (``dest``: elsewhere in the cache, as an adapter revision's ``/weights/adapters/{rev}``).

    ``image`` must contain folio (the engine image does). ``owner`` is an ownerReference to the
    InferenceService, so the Job goes with it. ``parallel``: the revision's (tensorParallelSize,
    pipelineParallelSize), which the Job checks the model against once it has the weights. ``draft``: the
    revision's draft model, where it goes (`prepull.draft_weights_path`) and the revision's maxModelLen (None:
    the model's own), fetched and checked by the same Job.
    """
    args = ["--source", model.source, "--dest", dest or weights_path(rev, model)]
    if model.revision:
        args += ["--revision", model.revision]
    if model.digest:
        args += ["--digest", model.digest]
    if parallel != (1, 1):
        args += ["--tensor-parallel-size", str(parallel[0]), "--pipeline-parallel-size", str(parallel[1])]
    pins: list[tuple[PinnedSource, str]] = [(model, "HF_TOKEN")]
    if draft is not None:
        pin = draft.pin
        args += ["--draft-source", pin.source, "--draft-dest", str(draft.dest)]
        args += ["--max-model-len", str(draft.max_model_len)] if draft.max_model_len else []
        args += ["--draft-revision", pin.revision] if pin.revision else []
        args += ["--draft-digest", pin.digest] if pin.digest else []
        pins.append((pin, DRAFT_TOKEN_ENV))
    mounts: list[Obj] = [{"name": "weights", "mountPath": CACHE_MOUNT}]
    volumes: list[Obj] = [{"name": "weights", "persistentVolumeClaim": {"claimName": cache_pvc_name(isvc)}}]
    env: list[Obj] = [{"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"}]
    claims: list[str] = []
    for pin, token_env in pins:
        if pin.scheme == "pvc" and (claim := pvc_claim_and_path(pin.source)[0]) not in claims:
            name = f"source-{len(claims)}" if claims else "source"
            mounts.append({"name": name, "mountPath": f"{SOURCE_MOUNT}/{claim}", "readOnly": True})
            volumes.append({"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
            claims.append(claim)
        if pin.credentials_secret_ref is not None:  # the token reaches this Job only, as an env var
            ref = pin.credentials_secret_ref
            env.append({"name": token_env, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    container = {
        "name": "prepull",
        "image": image,
        "command": ["python", "-m", "folio.operator.prepull"],
        "args": args,
        "env": env,
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}},
    }
    labels = component_labels(isvc, "prepull", rev)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(prepull_job_name(isvc, rev), namespace, labels, owner),
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "metadata": {"labels": dict(labels)},
                # It reads the hub, never the Kubernetes API: the default ServiceAccount's token stays out.
                "spec": harden({"restartPolicy": "Never", "containers": [container], "volumes": volumes},
                               scratch_size=PREPULL_SCRATCH, api_token=False),
            },
        },
    }


def _metadata(name: str, namespace: str, labels: dict[str, str], owner: Obj | None) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return meta
