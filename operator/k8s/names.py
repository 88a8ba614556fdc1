"""Every name Folio gives or reads in a cluster: labels, object names, ports, kinds, the namespace.

The planner names what it creates with these, the executor and the observer find it with them, the
router recognises its revisions' EndpointSlices by them and the analysis finds the router pods; no
other module spells a label, a port, an annotation or an object name out (tests/k8s/test_names.py
greps for the usual slips).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from folio.operator.spec import API_VERSION, DOMAIN, GROUP, KIND, PLURAL

Component = Literal["engine", "router", "prepull", "cache", "epp"]  # epp: an InferencePool's endpoint picker

ISVC_LABEL = f"{GROUP}/inferenceservice"
REVISION_LABEL = f"{GROUP}/revision"
COMPONENT_LABEL = "app.kubernetes.io/component"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "folio"
# Set by Kubernetes on every EndpointSlice of a Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"

ENGINE_PORT = 8000  # `folio serve` in an engine pod
# The readiness gate of engine pods that serve adapters: the operator sets it True once the pod holds every
# adapter revision that takes traffic (`folio.operator.reconcile.adapters`), so the routers (and any
# EndpointSlice reader) send it requests only then.
ADAPTERS_GATE = "serving.folio.dev/adapters-loaded"


def pod_engine_url(pod: dict[str, Any]) -> str:
    """An engine pod's API base URL, from its IP."""
    ip = (pod.get("status") or {}).get("podIP") or ""
    return f"http://{f'[{ip}]' if ':' in ip else ip}:{ENGINE_PORT}"
ENGINE_METRICS_PORT = 8001  # its /metrics alone (`--metrics-port`): the port a scraper is admitted to
# A multi-node engine's rendezvous: `folio serve --master-port` (torch's TCPStore on the leader) and the port
# after it (rank 0's step channel); the pods of a group reach each other there and nowhere else but the range below.
ENGINE_MASTER_PORT = 29500
# Where gloo and NCCL listen for their peer connections: ports the kernel picks from its ephemeral range
# (Linux's default net.ipv4.ip_local_port_range), so a NetworkPolicy can only name the range.
EPHEMERAL_PORTS = (32768, 60999)
ROUTER_PORT = 8080  # `folio router` in a router pod
ROUTER_SERVICE_PORT = 80  # the InferenceService's stable endpoint: Service `{isvc}`, port 80

# The Gateway API inference extension's pool (opt-in, `folio.operator.serving.inference_pool`).
INFERENCE_POOL: tuple[str, str] = ("inference.networking.k8s.io/v1", "InferencePool")  # (apiVersion, kind)
# The Gateway API route that splits a Gateway's traffic over those pools by status.traffic.
HTTP_ROUTE: tuple[str, str] = ("gateway.networking.k8s.io/v1", "HTTPRoute")
SCALED_OBJECT: tuple[str, str] = ("keda.sh/v1alpha1", "ScaledObject")  # KEDA's, with spec.autoscaling.keda
# A revision whose replica spans several pods (`folio.operator.serving.lws`): kubernetes-sigs/lws's.
LEADER_WORKER_SET: tuple[str, str] = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
# Set by LeaderWorkerSet on its pods: "0" on a group's leader, 1..size-1 on its workers.
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"  # the LeaderWorkerSet a pod belongs to
# The environment LeaderWorkerSet gives every container of a group (and `folio up` its group's processes):
# the leader's address, the pods in the group, the pod's index in it (`folio serve` reads all three).
LWS_LEADER_ADDRESS = "LWS_LEADER_ADDRESS"
LWS_GROUP_SIZE = "LWS_GROUP_SIZE"
LWS_WORKER_INDEX = "LWS_WORKER_INDEX"
# Fleet rollouts (`folio.operator.fleet`): read and watched, its status written; never planned or pruned.
ROLLOUT_POLICY: tuple[str, str] = (API_VERSION, "RolloutPolicy")

# (apiVersion, kind) -> plural, for every kind Folio reads or writes.
PLURALS: dict[tuple[str, str], str] = {
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "Service"): "services",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Pod"): "pods",
    ("v1", "Event"): "events",
    ("v1", "Secret"): "secrets",
    ("v1", "ConfigMap"): "configmaps",  # read only: a parity gate's prompt suite
    ("batch/v1", "Job"): "jobs",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("discovery.k8s.io/v1", "EndpointSlice"): "endpointslices",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    INFERENCE_POOL: "inferencepools",
    HTTP_ROUTE: "httproutes",  # only with InferencePools and spec.router.gateway
    SCALED_OBJECT: "scaledobjects",  # only with spec.autoscaling.keda (KEDA installed)
    LEADER_WORKER_SET: "leaderworkersets",  # only for a revision whose replica spans several pods
    (API_VERSION, KIND): PLURAL,
    ROLLOUT_POLICY: "rolloutpolicies",
}
# Every kind the planner produces: the executor prunes exactly these, the operator indexes them.
MANAGED_KINDS: tuple[tuple[str, str], ...] = (
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ServiceAccount"),
    ("v1", "PersistentVolumeClaim"),
    ("batch/v1", "Job"),
    ("policy/v1", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io/v1", "Role"),  # only with spec.access: its one Secret, for the routers
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
    INFERENCE_POOL,  # opt-in; kopf skips it where its CRD is absent
    HTTP_ROUTE,  # likewise, with the pools and a Gateway to attach to
    # Without KEDA in the cluster kopf logs that it cannot watch these, and there are none to prune.
    SCALED_OBJECT,
    LEADER_WORKER_SET,  # likewise without LeaderWorkerSet's CRD
)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# Where the router's pod mounts the overflow API key from `spec.overflow.apiKeySecretRef`.
OVERFLOW_KEY_DIR = "/var/run/secrets/folio.dev/overflow"
OVERFLOW_KEY_FILE = Path(OVERFLOW_KEY_DIR) / "api-key"
# The ClusterRole the chart creates for every router; the operator only binds it (RoleBinding per service).
ROUTER_CLUSTER_ROLE = "folio-router"
# Likewise for the endpoint pickers the operator deploys (`--endpoint-picker-image`): read pods and pools.
ENDPOINT_PICKER_CLUSTER_ROLE = "folio-endpoint-picker"


# ----------------------------------------------------------------------------- labels


def base_labels(isvc: str) -> dict[str, str]:
    """What every object of one InferenceService carries; the executor prunes by these."""
    return {
        "app.kubernetes.io/name": "folio",
        INSTANCE_LABEL: isvc,
        MANAGED_BY_LABEL: MANAGED_BY,
        ISVC_LABEL: isvc,
    }


def component_labels(isvc: str, component: Component, revision: str | None = None) -> dict[str, str]:
    labels = {**base_labels(isvc), COMPONENT_LABEL: component}
    if revision is not None:
        labels[REVISION_LABEL] = revision
    return labels


def selector(isvc: str, component: Component, revision: str | None = None) -> dict[str, str]:
    """Deployment selectors are immutable: only the labels that never change."""
    sel = {INSTANCE_LABEL: isvc, COMPONENT_LABEL: component}
    if revision is not None:
        sel[REVISION_LABEL] = revision
    return sel


def has_labels(obj: dict, labels: dict[str, str]) -> bool:
    found = (obj.get("metadata") or {}).get("labels") or {}
    return all(found.get(k) == v for k, v in labels.items())


# ------------------------------------------------------------------------ object names


def engine_name(isvc: str, revision: str) -> str:
    """The engine Deployment (or LeaderWorkerSet) and its headless Service."""
    return f"{isvc}-{revision}"


def engine_service_url(namespace: str, isvc: str, revision: str) -> str:
    """A revision's engine Service in the cluster's DNS (headless: the name resolves to its ready pods)."""
    return f"http://{engine_name(isvc, revision)}.{namespace}.svc:{ENGINE_PORT}"


def revision_of_service(isvc: str, service: str) -> str | None:
    """Inverse of `engine_name`: the revision an engine Service (or its EndpointSlices) belongs to."""
    prefix = f"{isvc}-"
    if not service.startswith(prefix) or service == prefix:
        return None
    return service[len(prefix) :]


def router_name(isvc: str) -> str:
    """The router Deployment and the Service clients use: the InferenceService's own name."""
    return isvc


def router_account_name(isvc: str) -> str:
    """The router's ServiceAccount and RoleBinding."""
    return f"{isvc}-router"


def router_keys_role_name(isvc: str) -> str:
    """The Role (and its RoleBinding) that lets the routers read spec.access's Secret of API keys, that one only."""
    return f"{isvc}-router-keys"


def cache_pvc_name(isvc: str) -> str:
    return f"{isvc}-weights"


def prepull_job_name(isvc: str, revision: str) -> str:
    return f"{isvc}-prepull-{revision}"


def disruption_budget_name(isvc: str, component: Component) -> str:
    return f"{isvc}-{component}"


def network_policy_name(isvc: str) -> str:
    """The NetworkPolicy that admits only the router (and the operator) to the engine pods."""
    return f"{isvc}-engine"


def group_policy_name(isvc: str, revision: str) -> str:
    """The NetworkPolicy that lets the pods of a revision's LeaderWorkerSet reach each other's collectives."""
    return f"{engine_name(isvc, revision)}-group"


def inference_pool_name(isvc: str, revision: str) -> str:
    """One revision's InferencePool (a kind of its own: no clash with the engine Deployment's name)."""
    return f"{isvc}-{revision}"


def endpoint_picker_name(isvc: str, revision: str) -> str:
    """The endpoint picker Service a revision's InferencePool's ``endpointPickerRef`` names: the upstream
    inferencepool chart's ``{pool}-epp``. One per pool, as an upstream picker serves exactly one pool (a
    shared one would pick from its own pool whatever the route chose). Its Deployment has the same name;
    Folio creates both only with `folio operator --endpoint-picker-image`."""
    return f"{inference_pool_name(isvc, revision)}-epp"


def endpoint_picker_account_name(isvc: str) -> str:
    """The ServiceAccount and RoleBinding every endpoint picker of ``isvc`` shares."""
    return f"{isvc}-epp"


def endpoint_picker_policy_name(isvc: str) -> str:
    """The NetworkPolicy that admits only the gateway to the endpoint pickers' ext-proc port."""
    return f"{isvc}-epp"


def http_route_name(isvc: str) -> str:
    """The HTTPRoute that splits a Gateway's traffic over the revisions' pools."""
    return isvc


# ------------------------------------------------------------------------- annotations


def override_annotation(name: str) -> str:
    """The annotation that asks for a manual override: ``folio.dev/promote``, ``…/abort``, ``…/retry``; for one
    adapter's rollout (``promote@ADAPTER``) ``folio.dev/promote-adapter``, whose value names the adapter."""
    override, _, adapter = name.partition("@")
    return f"{DOMAIN}/{override}-adapter" if adapter else f"{DOMAIN}/{override}"


# --------------------------------------------------------------------------- namespace


def namespace_in_pod() -> str | None:
    """The namespace of the pod this process runs in (its service account's), or None outside one."""
    try:
        return (SERVICE_ACCOUNT_DIR / "namespace").read_text().strip() or None
    except OSError:
        return None


def current_namespace() -> str:
    """Where a command acts by default: the pod's namespace, ``$POD_NAMESPACE``, the kube context's, or
    ``default`` — the order kubectl and client-go use."""
    found = namespace_in_pod() or os.environ.get("POD_NAMESPACE")
    if found:
        return found
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    try:  # $KUBECONFIG is read now: the client library read it once, when it was imported
        _, active = config.list_kube_config_contexts(config_file=os.environ.get("KUBECONFIG") or None)
    except (ConfigException, OSError):
        return "default"
    return str((active or {}).get("context", {}).get("namespace") or "default")
