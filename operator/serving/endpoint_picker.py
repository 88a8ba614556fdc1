"""The endpoint pickers (EPPs) of an InferenceService's InferencePools (opt-in: `--endpoint-picker-image`).

Each InferencePool's `endpointPickerRef` names a Service `{isvc}-{revision}-epp`; pools come and go with
revisions, so nobody could install their pickers ahead with the upstream `inferencepool` chart. With an
image, the operator deploys one per pool beside it: a Deployment and a Service `{isvc}-{revision}-epp`
(labelled with the revision, so it is pruned with its pool), running the upstream picker for exactly that
pool, plus a ServiceAccount and RoleBinding `{isvc}-epp` shared by the service's pickers. The binding
refers to the chart's ClusterRole (read pods and pools in this namespace), as the routers' does: the
operator holds `bind` on it instead of creating Roles and holding every permission they would grant.

The picker scrapes the engines' `/metrics` port (`folio serve --metrics-port`, not the API port the pool
targets); the engines' NetworkPolicy admits it there, and the gateway to the picker's ext-proc port.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from folio.operator.k8s.names import (
    ENGINE_METRICS_PORT,
    component_labels,
    endpoint_picker_account_name,
    endpoint_picker_name,
    inference_pool_name,
    selector,
)
from folio.operator.serving.inference_pool import GROUP as POOL_GROUP
from folio.operator.serving.security import harden

Obj = dict[str, Any]

# The upstream picker's ports (its chart's defaults): gRPC ext-proc for the gateway, gRPC health, metrics.
EXT_PROC_PORT = 9002
HEALTH_PORT = 9003
METRICS_PORT = 9090
HEALTH_SERVICE = "inference-extension"  # the gRPC health service the picker reports (no leader election)
# As upstream: a picker outlives the longest request it routed (engines drain for up to ~2 minutes).
GRACE_S = 130
SCRATCH = "64Mi"


def endpoint_picker_objects(
    isvc: str, namespace: str, revisions: Iterable[str], owner_reference: Obj, *,
    image: str, picker_port: int, cluster_role: str,
) -> list[Obj]:  # fmt: skip
    """The account the pickers share (first: their pods need it), then a picker (Deployment and Service)
    per pool; none without an image or a port (no `endpointPickerRef` to serve)."""
    revisions = list(revisions)
    if not image or not picker_port or not revisions:
        return []
    out = _account(isvc, namespace, owner_reference, cluster_role)
    for rev in revisions:
        out += [_deployment(isvc, namespace, rev, owner_reference, image),
                _service(isvc, namespace, rev, owner_reference, picker_port)]
    return out


def _meta(name: str, namespace: str, labels: dict[str, str], owner_reference: Obj) -> Obj:
    return {"name": name, "namespace": namespace, "labels": labels, "ownerReferences": [owner_reference]}


def _deployment(isvc: str, namespace: str, rev: str, owner_reference: Obj, image: str) -> Obj:
    labels = component_labels(isvc, "epp", rev)
    container: Obj = {
        "name": "epp",
        "image": image,
        "args": [
            "--pool-name", inference_pool_name(isvc, rev),
            "--pool-namespace", namespace,
            "--pool-group", POOL_GROUP,
            "--grpc-port", str(EXT_PROC_PORT),
            "--grpc-health-port", str(HEALTH_PORT),
            "--metrics-port", str(METRICS_PORT),
            # The pool targets the API port; Folio's engines serve /metrics on a port of its own.
            "--model-server-metrics-port", str(ENGINE_METRICS_PORT),
        ],
        "ports": [
            {"name": "grpc", "containerPort": EXT_PROC_PORT, "protocol": "TCP"},
            {"name": "grpc-health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "env": [{"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "readinessProbe": _probe(),
        "livenessProbe": _probe(),
    }
    pod_spec: Obj = {"serviceAccountName": endpoint_picker_account_name(isvc), "terminationGracePeriodSeconds": GRACE_S,
                     "containers": [container]}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(endpoint_picker_name(isvc, rev), namespace, labels, owner_reference),
        "spec": {
            "replicas": 1,  # a picker keeps per-pod state (queues, prefix caches): one per pool
            "selector": {"matchLabels": selector(isvc, "epp", rev)},
            "template": {
                "metadata": {"labels": dict(labels)},
                # It watches its pool and the pool's pods: it needs its token.
                "spec": harden(pod_spec, scratch_size=SCRATCH, api_token=True),
            },
        },
    }


def _probe() -> Obj:
    return {"grpc": {"port": HEALTH_PORT, "service": HEALTH_SERVICE}, "initialDelaySeconds": 5, "periodSeconds": 10}


def _service(isvc: str, namespace: str, rev: str, owner_reference: Obj, picker_port: int) -> Obj:
    """What the pool's `endpointPickerRef` names, on its port; HTTP/2 so that gateways speak gRPC to it."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(endpoint_picker_name(isvc, rev), namespace, component_labels(isvc, "epp", rev),
                          owner_reference),
        "spec": {
            "selector": selector(isvc, "epp", rev),
            "ports": [
                {"name": "grpc-ext-proc", "port": picker_port, "targetPort": "grpc", "protocol": "TCP",
                 "appProtocol": "http2"},
                {"name": "http-metrics", "port": METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def _account(isvc: str, namespace: str, owner_reference: Obj, cluster_role: str) -> list[Obj]:
    """The pickers' ServiceAccount, bound in this namespace only to the chart's read-only ClusterRole."""
    account, labels = endpoint_picker_account_name(isvc), component_labels(isvc, "epp")
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(account, namespace, labels, owner_reference)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(account, namespace, dict(labels), owner_reference),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    ]
