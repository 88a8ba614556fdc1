"""The operator's own NetworkPolicy: only the metrics port, from the configured namespaces; opt-out."""

from __future__ import annotations

import kubernetes_validate

from tests.chart import helm as h


def test_operator_pods_admit_only_metrics_scrapes(rendered: dict[str, list[h.Obj]]) -> None:
    objects = rendered["defaults"]
    policy = h.one(objects, "NetworkPolicy")
    kubernetes_validate.validate(policy, "1.30", strict=True)
    pod = h.one(objects, "Deployment")["spec"]["template"]
    assert all(pod["metadata"]["labels"].get(k) == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress to the API server stays open
    (rule,) = policy["spec"]["ingress"]
    metrics = next(p["containerPort"] for p in pod["spec"]["containers"][0]["ports"] if p["name"] == "metrics")
    assert rule == {"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "TCP", "port": metrics}]}


def test_metrics_namespaces_and_opt_out(helm: str) -> None:
    labels = {"kubernetes.io/metadata.name": "monitoring"}
    policy = h.one(h.template(helm, {"networkPolicy": {"metricsNamespaceLabels": labels}}), "NetworkPolicy")
    assert policy["spec"]["ingress"][0]["from"] == [{"namespaceSelector": {"matchLabels": labels}}]
    assert not h.find(h.template(helm, {"networkPolicy": {"enabled": False}}), "NetworkPolicy")


def test_operator_tells_engines_its_pod_labels(rendered: dict[str, list[h.Obj]]) -> None:
    """The engines' policies admit the operator by the labels the chart passes it."""
    pod = h.one(rendered["defaults"], "Deployment")["spec"]["template"]
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    pairs = dict(item.split("=", 1) for item in env["FOLIO_OPERATOR_POD_LABELS"]["value"].split(","))
    assert pairs and all(pod["metadata"]["labels"][k] == v for k, v in pairs.items())
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


def test_engine_scrapes_go_to_the_metrics_port_the_engines_policy_opens(rendered: dict[str, list[h.Obj]]) -> None:
    """The chart's engine ServiceMonitor selects the engine Services' `metrics` port: the one port of an engine
    that the engines' NetworkPolicy opens to `metricsNamespaceLabels` (never the API port)."""
    from folio.operator.serving.objects import engine_service
    from folio.operator.serving.plan import Placement
    from tests.serving.helpers import OWNER

    monitor = next(m for m in h.find(rendered["observability"], "ServiceMonitor") if m["metadata"]["name"].endswith("-engines"))
    (endpoint,) = monitor["spec"]["endpoints"]
    ports = {p["name"]: p for p in engine_service(OWNER, "r1")["spec"]["ports"]}
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert ports[endpoint["port"]]["port"] == Placement.cluster().metrics_port == 8001
