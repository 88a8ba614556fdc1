"""A serving plan as Kubernetes objects, fully specified for server-side apply.

Per running revision: an engine Deployment `{isvc}-{rev}` (zero replicas while its weights are not
verified), or a LeaderWorkerSet of that name when a replica spans several pods (`folio.operator.serving.lws`,
with a NetworkPolicy `{isvc}-{rev}-group` for its groups' collectives), and a headless Service of the same name, plus the pre-pull Job while those weights are
pending, and with ``autoscaling.keda`` a KEDA ScaledObject (`folio.operator.serving.keda`); with
InferencePools an InferencePool (`folio.operator.serving.inference_pool`) and, with an endpoint-picker
image, its picker's Deployment and Service (`folio.operator.serving.endpoint_picker`).
Per service: the weights cache PVC, the router (Deployment and Service named after the
InferenceService, its ServiceAccount, Role and RoleBinding), PodDisruptionBudgets, the engines'
NetworkPolicy and, with InferencePools and a Gateway, the HTTPRoute over them
(`folio.operator.serving.http_route`); with endpoint pickers, their ServiceAccount, RoleBinding and
NetworkPolicy. Pure: the
same plan always gives the same objects, so drift repair is just "render again and apply".
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from folio.operator.k8s.names import (
    ADAPTERS_GATE,
    ENDPOINT_PICKER_CLUSTER_ROLE,
    ENGINE_MASTER_PORT,
    ENGINE_METRICS_PORT,
    ENGINE_PORT,
    LWS_WORKER_INDEX_LABEL,
    OVERFLOW_KEY_DIR,
    OVERFLOW_KEY_FILE,
    ROUTER_CLUSTER_ROLE,
    ROUTER_PORT,
    ROUTER_SERVICE_PORT,
    Component,
    cache_pvc_name,
    component_labels,
    disruption_budget_name,
    endpoint_picker_policy_name,
    engine_name,
    group_policy_name,
    network_policy_name,
    router_account_name,
    router_keys_role_name,
    router_name,
    selector,
)
from folio.operator.prepull import CACHE_MOUNT
from folio.operator.serving import keda, lws, parallel
from folio.operator.serving.cache import prepull_job, weights_pvc
from folio.operator.serving.endpoint_picker import EXT_PROC_PORT, endpoint_picker_objects
from folio.operator.serving.endpoint_picker import METRICS_PORT as PICKER_METRICS_PORT
from folio.operator.serving.http_route import http_route
from folio.operator.serving.inference_pool import DEFAULT_PICKER_PORT, inference_pools, wanted
from folio.operator.serving.network_policy import (
    endpoint_picker_network_policy,
    endpoint_picker_policy_labels,
    engine_network_policy,
    group_network_policy,
    policy_labels,
)
from folio.operator.serving.plan import RevisionPlan, ServingPlan
from folio.operator.serving.security import harden
from folio.operator.spec import (
    API_VERSION,
    DEFAULT_IMAGE,
    KIND,
    InferenceServiceSpec,
    ResourceRequirements,
)

Obj = dict[str, Any]

# Loading a large model from a network volume can take many minutes: allow 20 before giving up.
STARTUP_PERIOD_S = 10
STARTUP_FAILURES = 120
# preStop keeps a terminating pod in the endpoints long enough for routers to notice, then
# SIGTERM makes the engine drain; the grace period covers long generations finishing.
PRESTOP_SLEEP_S = 10
ENGINE_GRACE_S = 120
DEFAULT_SHUTDOWN_S = 30.0  # `folio serve --shutdown-timeout` default
# Writable /tmp per pod (the root filesystem is read-only): compiled kernels for engines, little for routers.
ENGINE_SCRATCH = "4Gi"
ROUTER_SCRATCH = "64Mi"


@dataclass(frozen=True)
class Owner:
    """The InferenceService the objects belong to."""

    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class PlanSettings:
    """Operator-level choices that are not in the spec."""

    image: str = DEFAULT_IMAGE  # the operator's own image: router and pre-pull run it
    # Engines on several nodes read one cache: ReadWriteMany (ReadWriteOnce for a one-node cluster).
    cache_access_modes: tuple[str, ...] = ("ReadWriteMany",)
    # The chart's ClusterRole for routers (`folio operator --router-cluster-role`).
    router_cluster_role: str = ROUTER_CLUSTER_ROLE
    # Where the operator's own pods run, and their labels: the engines' NetworkPolicy admits them.
    operator_namespace: str | None = None
    operator_labels: tuple[tuple[str, str], ...] = ()
    # InferencePool for specs that leave `router.inferencePool` unset, and its endpoint picker's port (0: none)
    inference_pool: bool = False
    endpoint_picker_port: int = DEFAULT_PICKER_PORT
    # The pickers' image (`--endpoint-picker-image`; empty: users deploy their own) and the chart's
    # ClusterRole their RoleBinding refers to.
    endpoint_picker_image: str = ""
    endpoint_picker_cluster_role: str = ENDPOINT_PICKER_CLUSTER_ROLE

    def deploys_pickers(self, pools: bool) -> bool:
        """Pickers go with the pools, given an image and a port for the pools' references."""
        return pools and bool(self.endpoint_picker_image) and bool(self.endpoint_picker_port)


# ---------------------------------------------------------------------------- metadata


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


# ------------------------------------------------------------------------------ objects


def objects(serving: ServingPlan, owner: Owner, settings: PlanSettings | None = None) -> list[Obj]:
    """Every object the InferenceService should have right now."""
    settings, spec = settings or PlanSettings(), serving.spec
    ref = owner_reference(owner)
    # The cache is kept even with nothing running: a revision coming back reuses its weights.
    out: list[Obj] = [weights_pvc(owner.name, owner.namespace, spec.cache, access_modes=settings.cache_access_modes,
                                  owner=ref)]
    for rev in serving.revisions:
        if rev.pull_weights:
            out.append(prepull_job(owner.name, owner.namespace, rev.name, rev.model, image=settings.image, owner=ref,
                                   parallel=rev.parallel, draft=rev.draft_pull))
        workload = engine_workload(owner, spec, rev)
        out.append(workload)
        out.append(engine_service(owner, rev.name, leaders_only=rev.group_size > 1))
        if rev.group_size > 1:
            group = group_network_policy(owner.name, rev.name, spec,
                                         meta=_meta(owner, group_policy_name(owner.name, rev.name), policy_labels(owner.name)))
            if group is not None:
                out.append(group)
        if keda.scaled_by_keda(spec, rev.role, rev.pull_weights):
            out.append(keda.scaled_object(spec, owner.namespace, owner.name, rev.name, rev.role, ref,
                                          target=(workload["apiVersion"], workload["kind"])))
    for pull in serving.adapters.pulls:
        out.append(prepull_job(owner.name, owner.namespace, pull.revision, pull.pin, image=settings.image, owner=ref,
                               dest=pull.path))
    out += router_objects(owner, spec, settings)
    out += disruption_budgets(owner)
    pools = wanted(spec.router.inference_pool, settings.inference_pool)
    pickers = settings.deploys_pickers(pools)
    policy = engine_network_policy(
        owner.name, owner.namespace, spec, operator_namespace=settings.operator_namespace,
        operator_labels=dict(settings.operator_labels), pools=pools, pickers=pickers,
        meta=_meta(owner, network_policy_name(owner.name), policy_labels(owner.name)),
    )
    if policy is not None:
        out.append(policy)
    if pools:
        out += gateway_objects(serving, owner, settings)
    if pickers:
        picker_policy = endpoint_picker_network_policy(
            owner.name, spec, ext_proc_port=EXT_PROC_PORT, metrics_port=PICKER_METRICS_PORT,
            meta=_meta(owner, endpoint_picker_policy_name(owner.name), endpoint_picker_policy_labels(owner.name)),
        )
        if picker_policy is not None:
            out.append(picker_policy)
    return out


def gateway_objects(serving: ServingPlan, owner: Owner, settings: PlanSettings) -> list[Obj]:
    """A pool per running revision (with its endpoint picker, when the operator deploys them) and, with a
    Gateway to attach to, the route that splits over them."""
    ref, revisions = owner_reference(owner), [rev.name for rev in serving.revisions]
    out = inference_pools(owner.name, owner.namespace, revisions, ref, picker_port=settings.endpoint_picker_port)
    if settings.deploys_pickers(True):
        out += endpoint_picker_objects(owner.name, owner.namespace, revisions, ref,
                                       image=settings.endpoint_picker_image, picker_port=settings.endpoint_picker_port,
                                       cluster_role=settings.endpoint_picker_cluster_role)
    gateway = serving.spec.router.gateway
    if gateway is not None:
        out.append(http_route(owner.name, owner.namespace, gateway, revisions, serving.status.traffic, ref))
    return out


# ----------------------------------------------------------------------------- engine


def grace_period(rev: RevisionPlan) -> int:
    """Long enough for preStop plus the engine's own drain (`shutdownTimeout`), never below the default."""
    drain = rev.args.get("shutdownTimeout", DEFAULT_SHUTDOWN_S)
    drain_s = float(drain) if isinstance(drain, (int, float)) and not isinstance(drain, bool) else DEFAULT_SHUTDOWN_S
    return max(ENGINE_GRACE_S, math.ceil(PRESTOP_SLEEP_S + drain_s + 10))


def engine_workload(owner: Owner, spec: InferenceServiceSpec, rev: RevisionPlan) -> Obj:
    """The revision's engines: a Deployment of one pod per replica or, when a replica spans several pods, a
    LeaderWorkerSet of groups (`folio.operator.serving.lws`)."""
    return engine_deployment(owner, spec, rev) if rev.group_size == 1 else engine_leader_worker_set(owner, spec, rev)


def engine_deployment(owner: Owner, spec: InferenceServiceSpec, rev: RevisionPlan) -> Obj:
    name = engine_name(owner.name, rev.name)
    labels = component_labels(owner.name, "engine", rev.name)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(owner, name, labels),
        "spec": {
            "replicas": rev.replicas,  # none before the weights are verified in the cache
            "selector": {"matchLabels": selector(owner.name, "engine", rev.name)},
            "template": {"metadata": {"labels": dict(labels)},
                         "spec": _engine_pod(owner, spec, rev, _serving_container(spec, rev))},
        },
    }
    if keda.scaled_by_keda(spec, rev.role, rev.pull_weights):
        del deployment["spec"]["replicas"]  # KEDA's HPA owns it: applying it would fight
    return deployment


def engine_leader_worker_set(owner: Owner, spec: InferenceServiceSpec, rev: RevisionPlan) -> Obj:
    """Groups of `rev.group_size` pods sharing the revision's cache claim (read-only, as every engine pod):
    the leader serves, the workers (`--headless`) hold their ranks only."""
    labels = component_labels(owner.name, "engine", rev.name)
    leader = _engine_pod(owner, spec, rev, _serving_container(spec, rev))
    worker_container: Obj = {
        "name": "engine",
        "image": rev.image,
        "command": ["folio", "serve"],
        "args": rev.worker_args(),
        "ports": _rendezvous_ports(),
        "resources": _resources(parallel.engine_resources(spec.engine, rev.args)),
        # No probes: a worker serves no HTTP. It exits when its leader or a rank goes, and the group is
        # recreated; the leader's probes stand for the whole group.
        "volumeMounts": _engine_mounts(),
    }
    if spec.engine.env:
        worker_container["env"] = copy.deepcopy(spec.engine.env)
    worker = _engine_pod(owner, spec, rev, worker_container, gated=False)
    scaled = keda.scaled_by_keda(spec, rev.role, rev.pull_weights)
    return lws.leader_worker_set(_meta(owner, engine_name(owner.name, rev.name), labels), labels,
                                 replicas=None if scaled else rev.replicas, size=rev.group_size,
                                 leader=leader, worker=worker)


def _serving_container(spec: InferenceServiceSpec, rev: RevisionPlan) -> Obj:
    """The engine that serves: a Deployment's pods, a group's leader."""
    ports = _engine_ports(rev) + (_rendezvous_ports() if rev.group_size > 1 else [])
    container: Obj = {
        "name": "engine",
        "image": rev.image,
        "command": ["folio", "serve"],
        "args": rev.serve_args(),
        "ports": ports,
        # N GPUs for N ranks (per pod: a stage of a pipeline-parallel group)
        "resources": _resources(parallel.engine_resources(spec.engine, rev.args)),
        "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": STARTUP_PERIOD_S,
                         "failureThreshold": STARTUP_FAILURES, "timeoutSeconds": 5},
        # /ready turns 503 while draining, so a terminating pod leaves the endpoints at once.
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 5,
                           "failureThreshold": 2, "timeoutSeconds": 5},
        # An engine whose step loop died exits on its own; this catches one that hangs, within 15 s.
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 5},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_S)]}}},
        "volumeMounts": _engine_mounts(),
    }
    if spec.engine.env:
        container["env"] = copy.deepcopy(spec.engine.env)
    return container


def _engine_mounts() -> list[Obj]:
    return [
        {"name": "weights", "mountPath": CACHE_MOUNT, "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]


def _engine_pod(owner: Owner, spec: InferenceServiceSpec, rev: RevisionPlan, container: Obj, *,
                gated: bool = True) -> Obj:
    """An engine pod around ``container`` (``gated``: it serves, and waits on its adapters when it has any)."""
    pod_spec: Obj = {
        "terminationGracePeriodSeconds": grace_period(rev),
        "containers": [container],
        "volumes": [
            {"name": "weights", "persistentVolumeClaim": {"claimName": cache_pvc_name(owner.name),
                                                          "readOnly": True}},
            parallel.shm_volume(spec.engine, rev.args),  # sized for NCCL when the pod holds several ranks
        ],
    }
    if gated and rev.args.get("enableLora") is True:  # in rotation once it holds the adapters that take traffic
        pod_spec["readinessGates"] = [{"conditionType": ADAPTERS_GATE}]
    if spec.engine.node_selector:
        pod_spec["nodeSelector"] = dict(spec.engine.node_selector)
    if spec.engine.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(spec.engine.tolerations)
    if spec.engine.affinity:
        pod_spec["affinity"] = copy.deepcopy(spec.engine.affinity)
    if spec.engine.priority_class_name:
        pod_spec["priorityClassName"] = spec.engine.priority_class_name
    # Engines never talk to the API; Triton and torch-inductor caches fill /tmp.
    return harden(pod_spec, scratch_size=ENGINE_SCRATCH, api_token=False)


def _engine_ports(rev: RevisionPlan) -> list[Obj]:
    """The API port `http` and, with `--metrics-port`, `metrics`: /metrics alone, for the autoscaler and
    Prometheus (the NetworkPolicy admits scrapers to it and not to the API)."""
    ports: list[Obj] = [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    if rev.metrics_port is not None:
        ports.append({"name": "metrics", "containerPort": rev.metrics_port, "protocol": "TCP"})
    return ports


def _rendezvous_ports() -> list[Obj]:
    """A group's rendezvous (the leader's TCPStore) and rank 0's step channel (`--master-port` and the next)."""
    return [{"name": "rendezvous", "containerPort": ENGINE_MASTER_PORT, "protocol": "TCP"},
            {"name": "steps", "containerPort": ENGINE_MASTER_PORT + 1, "protocol": "TCP"}]


def engine_service(owner: Owner, revision: str, *, leaders_only: bool = False) -> Obj:
    """Headless: the router balances over the revision's pod endpoints itself (its `http` port); `metrics`
    is there for a ServiceMonitor to select. ``leaders_only``: of a LeaderWorkerSet's groups, the leaders,
    which serve for their group (its workers have no HTTP)."""
    name = engine_name(owner.name, revision)
    pods = selector(owner.name, "engine", revision)
    if leaders_only:
        pods[LWS_WORKER_INDEX_LABEL] = "0"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(owner, name, component_labels(owner.name, "engine", revision)),
        "spec": {
            "clusterIP": "None",
            "selector": pods,
            "ports": [
                {"name": "http", "port": ENGINE_PORT, "targetPort": "http", "protocol": "TCP"},
                {"name": "metrics", "port": ENGINE_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
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
    isvc, account = owner.name, router_account_name(owner.name)
    labels = component_labels(isvc, "router")
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
    pod_spec: Obj = {"serviceAccountName": account, "containers": [container]}
    key_ref = spec.overflow.api_key_secret_ref if spec.overflow else None
    if key_ref is not None:
        # The kubelet reads the Secret, not the router: no Secret permission anywhere. Optional, so that
        # a missing Secret is reported by the router (overflow off) instead of a pod stuck starting.
        pod_spec["volumes"] = [{"name": "overflow-key", "secret": {
            "secretName": key_ref.name, "optional": True, "items": [{"key": key_ref.key, "path": OVERFLOW_KEY_FILE.name}],
        }}]
        container["volumeMounts"] = [{"name": "overflow-key", "mountPath": OVERFLOW_KEY_DIR, "readOnly": True}]
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _meta(owner, account, labels),
        },
        {
            # Binds the chart's router ClusterRole in this namespace: the operator holds `bind` on that
            # one role only, instead of holding every permission it grants.
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(owner, account, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": settings.router_cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": owner.namespace}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(owner, router_name(isvc), labels),
            "spec": {
                "replicas": spec.router.replicas,
                "selector": {"matchLabels": selector(isvc, "router")},
                "template": {
                    "metadata": {"labels": dict(labels)},
                    # The router watches its InferenceService and the EndpointSlices: it needs its token.
                    "spec": harden(pod_spec, scratch_size=ROUTER_SCRATCH, api_token=True),
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(owner, router_name(isvc), labels),
            "spec": {
                "selector": selector(isvc, "router"),
                "ports": [{"name": "http", "port": ROUTER_SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}],
            },
        },
        *keys_role(owner, spec),
    ]


def keys_role(owner: Owner, spec: InferenceServiceSpec) -> list[Obj]:
    """With spec.access, a Role that lets the routers get, list and watch the Secret of API keys, that one
    Secret only (they follow its rotations through the API: a mounted Secret is refreshed too late), and its
    RoleBinding. The operator holds those permissions itself, as the API server asks of whoever grants them."""
    ref = spec.access.api_keys_secret_ref if spec.access is not None else None
    if ref is None:
        return []
    isvc, name = owner.name, router_keys_role_name(owner.name)
    labels = component_labels(isvc, "router")
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(owner, name, labels),
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [ref.name],
                       "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(owner, name, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": router_account_name(isvc), "namespace": owner.namespace}],
        },
    ]


def disruption_budgets(owner: Owner) -> list[Obj]:
    """Voluntary evictions (node drains) take engine and router pods one at a time."""
    components: tuple[Component, ...] = ("engine", "router")
    return [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(owner, disruption_budget_name(owner.name, c), component_labels(owner.name, c)),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(owner.name, c)}},
        }
        for c in components
    ]
