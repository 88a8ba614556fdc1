"""The pure planner: from an InferenceService's metadata, spec and status to the objects it needs.

No I/O and no clock: the same input always gives the same objects, so drift repair is just
"plan again and apply". `status.revisions` (maintained by `folio.operator.rollout`) says which
revisions run; the spec supplies what is shared by all of them (replicas, scheduling, router).

Per revision (Stable, Canary or Retiring): an engine Deployment `{isvc}-{rev}` and a headless
Service of the same name; while its weights are not verified, a pre-pull Job and zero replicas,
so no serving pod starts before the weights it must serve are in the cache. Per service: the
weights cache PVC, the router (Deployment + Service named after the InferenceService, its
ServiceAccount, Role and RoleBinding) and PodDisruptionBudgets. The cache PVC and the pre-pull
Job come from `folio.operator.prepull`, which owns the cache layout.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from folio.operator import prepull
from folio.operator.engine_args import PlanningError, engine_flags
from folio.operator.spec import (
    API_VERSION,
    DEFAULT_IMAGE,
    GROUP,
    KIND,
    PLURAL,
    InferenceServiceSpec,
    InferenceServiceStatus,
    ResourceRequirements,
    RevisionStatus,
)

Obj = dict[str, Any]

ENGINE_PORT = 8000
ROUTER_PORT = 8080
# Loading a large model from a network volume can take many minutes: allow 20 before giving up.
STARTUP_PERIOD_S = 10
STARTUP_FAILURES = 120
# preStop keeps a terminating pod in the endpoints long enough for routers to notice, then
# SIGTERM makes the engine drain; the grace period covers long generations finishing.
PRESTOP_SLEEP_S = 10
ENGINE_GRACE_S = 120
DEFAULT_SHUTDOWN_S = 30.0  # `folio serve --shutdown-timeout` default
RUNNING_ROLES = ("Stable", "Canary", "Retiring")


@dataclass(frozen=True)
class Owner:
    """The InferenceService the objects belong to."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> Owner:
        return cls(name=meta["name"], namespace=meta["namespace"], uid=meta.get("uid", ""))


@dataclass(frozen=True)
class PlanSettings:
    """Operator-level choices that are not in the spec."""

    image: str = DEFAULT_IMAGE  # the operator's own image: router and pre-pull run it
    # Engines on several nodes read one cache: ReadWriteMany (ReadWriteOnce for a one-node cluster).
    cache_access_modes: tuple[str, ...] = ("ReadWriteMany",)


# ----------------------------------------------------------------------------- labels


def base_labels(isvc: str) -> dict[str, str]:
    """What every object of one InferenceService carries; the executor prunes by these."""
    return {
        "app.kubernetes.io/name": "folio",
        "app.kubernetes.io/instance": isvc,
        "app.kubernetes.io/managed-by": "folio",
        f"{GROUP}/inferenceservice": isvc,
    }


def component_labels(isvc: str, component: str, revision: str | None = None) -> dict[str, str]:
    labels = {**base_labels(isvc), "app.kubernetes.io/component": component}
    if revision is not None:
        labels[f"{GROUP}/revision"] = revision
    return labels


def _selector(isvc: str, component: str, revision: str | None = None) -> dict[str, str]:
    # Deployment selectors are immutable: keep them to the labels that never change.
    sel = {"app.kubernetes.io/instance": isvc, "app.kubernetes.io/component": component}
    if revision is not None:
        sel[f"{GROUP}/revision"] = revision
    return sel


def owner_reference(owner: Owner) -> Obj:
    """Children go with their InferenceService (garbage collection) and point back to it."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _meta(owner: Owner, name: str, labels: dict[str, str]) -> Obj:
    return {"name": name, "namespace": owner.namespace, "labels": dict(labels),
            "ownerReferences": [owner_reference(owner)]}


# ------------------------------------------------------------------------ names/paths


def engine_name(isvc: str, revision: str) -> str:
    return f"{isvc}-{revision}"


def router_name(isvc: str) -> str:
    return f"{isvc}-router"


def weights_pvc_name(isvc: str) -> str:
    return prepull.cache_pvc_name(isvc)


# ------------------------------------------------------------------------------- plan


def validate(spec: InferenceServiceSpec) -> None:
    """Raise `PlanningError` when the spec's own revision could not be planned."""
    engine_flags(spec.engine.args)
    try:
        prepull.model_dir_name(spec.model)
        if spec.model.scheme == "pvc":
            prepull.pvc_claim_and_path(spec.model.source)
    except prepull.WeightsError as exc:
        raise PlanningError("InvalidModelSource", f"spec.model.source: {exc}") from exc


def plan(
    meta: Mapping[str, Any],
    spec: InferenceServiceSpec,
    status: InferenceServiceStatus,
    settings: PlanSettings | None = None,
) -> list[Obj]:
    """Every object the InferenceService should have right now, fully specified for server-side apply."""
    settings = settings or PlanSettings()
    owner = Owner.from_meta(meta)
    running = [r for r in status.revisions if r.role in RUNNING_ROLES]
    # The cache is kept even with nothing running: a revision coming back reuses its weights.
    objects: list[Obj] = [prepull.weights_pvc(owner.name, owner.namespace, spec.cache,
                                              access_modes=settings.cache_access_modes,
                                              owner=owner_reference(owner))]
    for rev in running:
        if not rev.weights_ready:
            objects.append(prepull.prepull_job(owner.name, owner.namespace, rev.name, rev.model,
                                               image=settings.image, owner=owner_reference(owner)))
        objects.append(engine_deployment(owner, spec, rev))
        objects.append(engine_service(owner, rev))
    objects += router_objects(owner, spec, settings)
    objects += disruption_budgets(owner, spec)
    return objects


# ----------------------------------------------------------------------------- engine


def engine_args(owner: Owner, spec: InferenceServiceSpec, rev: RevisionStatus) -> list[str]:
    args = [
        "--model", prepull.weights_path(rev.name, rev.model),
        # One name for every revision: clients must not notice which one answers.
        "--served-model-name", spec.model.served_name or owner.name,
        "--host", "0.0.0.0",
        "--port", str(ENGINE_PORT),
    ]
    if rev.model.revision:
        args += ["--revision", rev.model.revision]
    if rev.model.digest:
        args += ["--digest", rev.model.digest]
    return args + engine_flags(rev.args)


def grace_period(rev: RevisionStatus) -> int:
    """Long enough for preStop plus the engine's own drain (`shutdownTimeout`), never below the default."""
    drain = rev.args.get("shutdownTimeout", DEFAULT_SHUTDOWN_S)
    drain_s = float(drain) if isinstance(drain, (int, float)) and not isinstance(drain, bool) else DEFAULT_SHUTDOWN_S
    return max(ENGINE_GRACE_S, math.ceil(PRESTOP_SLEEP_S + drain_s + 10))


def engine_deployment(owner: Owner, spec: InferenceServiceSpec, rev: RevisionStatus) -> Obj:
    name = engine_name(owner.name, rev.name)
    labels = component_labels(owner.name, "engine", rev.name)
    container: Obj = {
        "name": "engine",
        "image": rev.image,
        "command": ["folio", "serve"],
        "args": engine_args(owner, spec, rev),
        "ports": [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}],
        "resources": _resources(spec.engine.resources),
        "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": STARTUP_PERIOD_S,
                         "failureThreshold": STARTUP_FAILURES, "timeoutSeconds": 5},
        # /ready turns 503 while draining, so a terminating pod leaves the endpoints at once.
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5,
                           "failureThreshold": 2, "timeoutSeconds": 5},
        # An engine whose step loop died exits on its own; this catches one that hangs, within 15 s.
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 5},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_S)]}}},
        "volumeMounts": [
            {"name": "weights", "mountPath": prepull.CACHE_MOUNT, "readOnly": True},
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    if spec.engine.env:
        container["env"] = copy.deepcopy(spec.engine.env)
    pod_spec: Obj = {
        "automountServiceAccountToken": False,  # engines never talk to the API
        "terminationGracePeriodSeconds": grace_period(rev),
        "containers": [container],
        "volumes": [
            {"name": "weights", "persistentVolumeClaim": {"claimName": prepull.cache_pvc_name(owner.name),
                                                          "readOnly": True}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    if spec.engine.node_selector:
        pod_spec["nodeSelector"] = dict(spec.engine.node_selector)
    if spec.engine.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(spec.engine.tolerations)
    if spec.engine.affinity:
        pod_spec["affinity"] = copy.deepcopy(spec.engine.affinity)
    if spec.engine.priority_class_name:
        pod_spec["priorityClassName"] = spec.engine.priority_class_name
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, name, labels),
        "spec": {
            # No serving pod before the weights are verified in the cache.
            "replicas": spec.replicas if rev.weights_ready else 0,
            "selector": {"matchLabels": _selector(owner.name, "engine", rev.name)},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }


def engine_service(owner: Owner, rev: RevisionStatus) -> Obj:
    """Headless: the router balances over the revision's pod endpoints itself."""
    name = engine_name(owner.name, rev.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, name, component_labels(owner.name, "engine", rev.name)),
        "spec": {
            "clusterIP": "None",
            "selector": _selector(owner.name, "engine", rev.name),
            "ports": [{"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _resources(res: ResourceRequirements) -> Obj:
    out: Obj = {}
    if res.limits:
        out["limits"] = {k: str(v) for k, v in res.limits.items()}
    if res.requests:
        out["requests"] = {k: str(v) for k, v in res.requests.items()}
    return out


# ----------------------------------------------------------------------------- router


def router_objects(owner: Owner, spec: InferenceServiceSpec, settings: PlanSettings) -> list[Obj]:
    isvc, account = owner.name, router_name(owner.name)
    labels = component_labels(isvc, "router")
    rules: list[Obj] = [
        {"apiGroups": [GROUP], "resources": [PLURAL], "resourceNames": [isvc], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    ]
    secrets = sorted({ref.name for ref in [spec.overflow and spec.overflow.api_key_secret_ref] if ref})
    if secrets:  # an empty resourceNames would mean every Secret
        rules.append({"apiGroups": [""], "resources": ["secrets"], "resourceNames": secrets, "verbs": ["get"]})
    container: Obj = {
        "name": "router",
        "image": spec.router.image or settings.image,
        "command": ["folio", "router"],
        "args": ["--name", isvc, "--kubernetes", "--namespace", owner.namespace, "--port", str(ROUTER_PORT)],
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "resources": _resources(spec.router.resources),
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                          "failureThreshold": 3},
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(owner, account, labels),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(owner, account, labels),
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(owner, account, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": owner.namespace}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(owner, isvc, labels),
            "spec": {
                "replicas": spec.router.replicas,
                "selector": {"matchLabels": _selector(isvc, "router")},
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {"serviceAccountName": account, "containers": [container]},
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(owner, isvc, labels),
            "spec": {
                "selector": _selector(isvc, "router"),
                "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
            },
        },
    ]


def disruption_budgets(owner: Owner, spec: InferenceServiceSpec) -> list[Obj]:
    """Voluntary evictions (node drains) take engine and router pods one at a time."""
    budgets = []
    for component in ("engine", "router"):
        budgets.append({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(owner, f"{owner.name}-{component}", component_labels(owner.name, component)),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _selector(owner.name, component)}},
        })
    return budgets


__all__ = ["Owner", "PlanSettings", "PlanningError", "plan", "validate"]
