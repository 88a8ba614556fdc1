"""The NetworkPolicy that keeps an InferenceService's engine pods private.

Engines have no authentication of their own (the router holds the API keys), so a pod anywhere in
the cluster could otherwise call them directly. `{isvc}-engine` has two ingress rules:

- the engine (API) port admits only this InferenceService's router pods and the operator's pods
  (its namespace and labels, when it knows them) and, while InferencePools are published, the gateway
  (`spec.networkPolicy.gatewayNamespaceLabels` / `gatewayPodLabels`: its proxies, the pools' endpoint
  pickers); neither set admits no gateway, so a pool never opens the engines to a whole cluster;
- the metrics port (`folio serve --metrics-port`: `/metrics` alone) admits the operator's pods (the
  autoscaler reads it) and, if `spec.networkPolicy.metricsNamespaceLabels` is set, pods in
  namespaces with those labels (Prometheus), which thus never reach the API; with endpoint pickers
  deployed (`folio.operator.serving.endpoint_picker`), also this InferenceService's pickers, which
  score the engines by those metrics.

A revision whose replicas span several pods (a LeaderWorkerSet, `folio.operator.serving.lws`) gets
`{isvc}-{rev}-group` besides: its pods admit each other, and only each other, on the rendezvous ports
(`--master-port` and the next) and the ephemeral range gloo and NCCL listen on.

The pickers get a policy of their own, `{isvc}-epp`: the gateway (the same labels) reaches their ext-proc
port only, and metrics scrapers their metrics port; nothing else reaches them.

Kubelet probes are node traffic, which NetworkPolicies do not filter on common CNIs.
`spec.networkPolicy.enabled: false` drops it (then the executor prunes it).
"""

from __future__ import annotations

from typing import Any

from folio.operator.k8s.names import (
    ENGINE_MASTER_PORT,
    ENGINE_METRICS_PORT,
    ENGINE_PORT,
    EPHEMERAL_PORTS,
    component_labels,
    selector,
)
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
    pools: bool = False,
    pickers: bool = False,
) -> Obj | None:
    """The policy for ``isvc``'s engines, or None when the spec opts out. ``meta``: its metadata;
    ``pools``: InferencePools are published (a gateway reaches the engines past the router);
    ``pickers``: the operator deploys their endpoint pickers (which scrape the engines' metrics)."""
    settings = spec.network_policy
    if not settings.enabled:
        return None
    operator: list[Obj] = []
    if operator_namespace and operator_labels:
        operator.append({"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}},
                         "podSelector": {"matchLabels": dict(operator_labels)}})
    api_peers: list[Obj] = [{"podSelector": {"matchLabels": selector(isvc, "router")}}, *operator]
    if pools:
        api_peers += _gateway_peers(settings.gateway_namespace_labels, settings.gateway_pod_labels)
    metrics_peers: list[Obj] = list(operator)
    if pickers:
        metrics_peers.append({"podSelector": {"matchLabels": selector(isvc, "epp")}})
    if settings.metrics_namespace_labels:
        metrics_peers.append({"namespaceSelector": {"matchLabels": dict(settings.metrics_namespace_labels)}})
    ingress = [{"from": api_peers, "ports": [{"protocol": "TCP", "port": ENGINE_PORT}]}]
    if metrics_peers:  # an empty `from` would admit everyone
        ingress.append({"from": metrics_peers, "ports": [{"protocol": "TCP", "port": ENGINE_METRICS_PORT}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            # every revision's engines: the selector holds no revision
            "podSelector": {"matchLabels": selector(isvc, "engine")},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def group_network_policy(isvc: str, revision: str, spec: InferenceServiceSpec, *, meta: Obj) -> Obj | None:
    """The policy that lets the pods of ``revision``'s LeaderWorkerSet reach each other's collectives, or None
    when the spec opts out. Policies add up: with `engine_network_policy`, a group's pods admit the router and
    the operator to the API as every engine does, and only their own revision's pods to these ports."""
    if not spec.network_policy.enabled:
        return None
    group = selector(isvc, "engine", revision)  # one revision, one LeaderWorkerSet
    low, high = EPHEMERAL_PORTS
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": dict(group)},
            "policyTypes": ["Ingress"],
            "ingress": [{
                "from": [{"podSelector": {"matchLabels": dict(group)}}],
                "ports": [
                    # the leader's TCPStore (rendezvous) and rank 0's step channel
                    {"protocol": "TCP", "port": ENGINE_MASTER_PORT, "endPort": ENGINE_MASTER_PORT + 1},
                    # gloo and NCCL bind their peer sockets to ports the kernel picks from its ephemeral range
                    # (no option pins them), so only the range can be named
                    {"protocol": "TCP", "port": low, "endPort": high},
                ],
            }],
        },
    }  # fmt: skip


def endpoint_picker_network_policy(
    isvc: str, spec: InferenceServiceSpec, *, ext_proc_port: int, metrics_port: int, meta: Obj
) -> Obj | None:
    """The policy for ``isvc``'s endpoint pickers, or None when the spec opts out: the gateway to the
    ext-proc port, scrapers (`metricsNamespaceLabels`) to the metrics port; a port without peers is closed."""
    settings = spec.network_policy
    if not settings.enabled:
        return None
    ingress: list[Obj] = []
    gateway = _gateway_peers(settings.gateway_namespace_labels, settings.gateway_pod_labels)
    if gateway:  # an empty `from` would admit everyone
        ingress.append({"from": gateway, "ports": [{"protocol": "TCP", "port": ext_proc_port}]})
    if settings.metrics_namespace_labels:
        ingress.append({"from": [{"namespaceSelector": {"matchLabels": dict(settings.metrics_namespace_labels)}}],
                        "ports": [{"protocol": "TCP", "port": metrics_port}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {"podSelector": {"matchLabels": selector(isvc, "epp")}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _gateway_peers(namespace_labels: dict[str, str] | None, pod_labels: dict[str, str] | None) -> list[Obj]:
    """One peer for the gateway: both selectors together (AND); none when neither is set (an empty
    selector would admit every pod, or every namespace)."""
    peer: Obj = {}
    if namespace_labels:
        peer["namespaceSelector"] = {"matchLabels": dict(namespace_labels)}
    if pod_labels:
        peer["podSelector"] = {"matchLabels": dict(pod_labels)}
    return [peer] if peer else []


def policy_labels(isvc: str) -> dict[str, str]:
    return component_labels(isvc, "engine")


def endpoint_picker_policy_labels(isvc: str) -> dict[str, str]:
    return component_labels(isvc, "epp")
