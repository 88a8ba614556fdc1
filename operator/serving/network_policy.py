"""The NetworkPolicy that keeps an InferenceService's engine pods private.

Engines have no authentication of their own (the router holds the API keys), so a pod anywhere in
the cluster could otherwise call them directly. `{isvc}-engine` admits traffic to the engine port
only from this InferenceService's router pods, from the operator's pods (its namespace and labels,
when it knows them) and, if `spec.networkPolicy.metricsNamespaceLabels` is set, from pods in
namespaces with those labels (Prometheus scraping `/metrics`, which is served on the same port).
Kubelet probes are node traffic, which NetworkPolicies do not filter on common CNIs.
`spec.networkPolicy.enabled: false` drops it (then the executor prunes it).
"""

from __future__ import annotations

from typing import Any

from folio.operator.k8s.names import ENGINE_PORT, component_labels, selector
from folio.operator.spec import InferenceServiceSpec

Obj = dict[str, Any]
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by Kubernetes on every namespace


def engine_network_policy(
    isvc: str,
    namespace: str,
    spec: InferenceServiceSpec,
    *,
    operator_namespace: str | None,
    operator_labels: dict[str, str],
    meta: Obj,
) -> Obj | None:
    """The policy for ``isvc``'s engines, or None when the spec opts out. ``meta``: its metadata."""
    settings = spec.network_policy
    if not settings.enabled:
        return None
    peers: list[Obj] = [{"podSelector": {"matchLabels": selector(isvc, "router")}}]
    if operator_namespace and operator_labels:
        peers.append({"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}},
                      "podSelector": {"matchLabels": dict(operator_labels)}})
    if settings.metrics_namespace_labels:
        peers.append({"namespaceSelector": {"matchLabels": dict(settings.metrics_namespace_labels)}})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            # every revision's engines: the selector holds no revision
            "podSelector": {"matchLabels": selector(isvc, "engine")},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": ENGINE_PORT}]}],
        },
    }




def policy_labels(isvc: str) -> dict[str, str]:
    return component_labels(isvc, "engine")
