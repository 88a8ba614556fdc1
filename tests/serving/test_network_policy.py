"""The engines' NetworkPolicy: only their routers, the operator and (opted in) Prometheus get in."""

from __future__ import annotations

import kubernetes_validate

from folio.operator.serving.objects import PlanSettings, objects
from folio.operator.serving.plan import Placement, plan
from folio.operator.spec import InferenceServiceStatus
from tests.serving.helpers import OWNER, make_spec, objects_by_key, revision

OPERATOR = PlanSettings(operator_namespace="folio-system",
                        operator_labels=(("app.kubernetes.io/component", "operator"), ("app.kubernetes.io/name", "folio")))


def _matches(selector: dict, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _planned(spec, settings: PlanSettings, *revisions) -> dict:  # type: ignore[no-untyped-def]
    serving = plan("chat", spec, InferenceServiceStatus(revisions=list(revisions)), Placement.cluster())
    return {(o["kind"], o["metadata"]["name"]): o for o in objects(serving, OWNER, settings)}


def test_engines_admit_only_their_routers_and_the_operator() -> None:
    spec = make_spec()
    canary = make_spec(engine={"image": "registry.example/folio:2"})
    objs = _planned(canary, OPERATOR, revision(spec), revision(canary, "Canary"))
    policy = objs[("NetworkPolicy", "chat-engine")]
    kubernetes_validate.validate(policy, "1.30", strict=True)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    engines = [o for o in objs.values() if o["kind"] == "Deployment" and o["metadata"]["name"] != "chat"]
    assert len(engines) == 2
    for engine in engines:  # every revision's pods are covered
        assert _matches(policy["spec"]["podSelector"], engine["spec"]["template"]["metadata"]["labels"])
    router_pod = objs[("Deployment", "chat")]["spec"]["template"]["metadata"]["labels"]
    assert not _matches(policy["spec"]["podSelector"], router_pod)
    rule, metrics_rule = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    router_peer, operator_peer = rule["from"]
    # the metrics port (/metrics alone): the operator's autoscaler, and no router
    assert metrics_rule == {"from": [operator_peer], "ports": [{"protocol": "TCP", "port": 8001}]}
    assert set(router_peer) == {"podSelector"} and _matches(router_peer["podSelector"], router_pod)
    # another InferenceService's routers do not match
    assert not _matches(router_peer["podSelector"], {**router_pod, "app.kubernetes.io/instance": "other"})
    assert operator_peer == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "folio-system"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator", "app.kubernetes.io/name": "folio"}},
    }


def _ports_admitting(policy: dict, peer: dict) -> set[int]:
    return {p["port"] for rule in policy["spec"]["ingress"] if peer in rule["from"] for p in rule["ports"]}


def test_metrics_namespaces_reach_the_metrics_port_and_never_the_api() -> None:
    monitoring = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    spec = make_spec(networkPolicy={"metricsNamespaceLabels": {"kubernetes.io/metadata.name": "monitoring"}})
    for settings in (OPERATOR, PlanSettings()):
        policy = _planned(spec, settings, revision(spec))[("NetworkPolicy", "chat-engine")]
        kubernetes_validate.validate(policy, "1.30", strict=True)
        api, metrics = policy["spec"]["ingress"]
        assert api["ports"] == [{"protocol": "TCP", "port": 8000}]
        assert metrics["ports"] == [{"protocol": "TCP", "port": 8001}]
        assert _ports_admitting(policy, monitoring) == {8001}  # the scraper never reaches the API
        router = api["from"][0]
        assert _ports_admitting(policy, router) == {8000}
        operators = [p for p in api["from"] if "namespaceSelector" in p]
        assert len(operators) == (1 if settings is OPERATOR else 0)  # only where the operator knows its pods
        for operator in operators:
            assert _ports_admitting(policy, operator) == {8000, 8001}


def test_metrics_port_stays_closed_without_peers_and_the_whole_policy_opts_out() -> None:
    spec = make_spec()
    policy = objects_by_key(spec, revision(spec))[("NetworkPolicy", "chat-engine")]
    # no operator labels, no metrics namespaces: no rule for the metrics port (an empty `from` admits all)
    (api,) = policy["spec"]["ingress"]
    assert api["ports"] == [{"protocol": "TCP", "port": 8000}] and api["from"]
    off = make_spec(networkPolicy={"enabled": False})
    assert not [k for k in objects_by_key(off, revision(off)) if k[0] == "NetworkPolicy"]


def test_operator_pod_labels_flag() -> None:
    import pytest

    from folio.operator.controller.cli import parse_labels

    assert parse_labels("b=2, a=1,") == (("a", "1"), ("b", "2"))
    assert parse_labels("") == ()
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_labels("novalue")


GATEWAY_NS = {"kubernetes.io/metadata.name": "gateway-system"}
GATEWAY_PODS = {"gateway.networking.k8s.io/gateway-name": "inference-gateway"}


def test_with_inference_pools_the_gateway_reaches_the_api_port_and_nothing_else() -> None:
    spec = make_spec(router={"inferencePool": True, "gateway": {"name": "inference-gateway"}},
                     networkPolicy={"gatewayNamespaceLabels": GATEWAY_NS, "gatewayPodLabels": GATEWAY_PODS})
    policy = _planned(spec, OPERATOR, revision(spec))[("NetworkPolicy", "chat-engine")]
    kubernetes_validate.validate(policy, "1.30", strict=True)
    gateway = {"namespaceSelector": {"matchLabels": GATEWAY_NS}, "podSelector": {"matchLabels": GATEWAY_PODS}}
    assert _ports_admitting(policy, gateway) == {8000}  # one peer: those pods in those namespaces (AND)
    # pod labels alone: those pods in the service's own namespace (e.g. the pools' endpoint pickers)
    pickers = make_spec(router={"inferencePool": True}, networkPolicy={"gatewayPodLabels": {"app": "epp"}})
    policy = _planned(pickers, OPERATOR, revision(pickers))[("NetworkPolicy", "chat-engine")]
    assert _ports_admitting(policy, {"podSelector": {"matchLabels": {"app": "epp"}}}) == {8000}


def test_the_gateway_is_admitted_only_while_pools_are_published_and_only_when_named() -> None:
    labels = {"gatewayNamespaceLabels": GATEWAY_NS}
    without_pools = make_spec(networkPolicy=labels)  # the spec names a gateway but publishes no pool
    defaults = make_spec(router={"inferencePool": True})  # pools, and no gateway selectors: none admitted
    empty = make_spec(router={"inferencePool": True},
                      networkPolicy={"gatewayNamespaceLabels": {}, "gatewayPodLabels": {}})  # never "everyone"
    for spec in (without_pools, defaults, empty):
        policy = _planned(spec, OPERATOR, revision(spec))[("NetworkPolicy", "chat-engine")]
        api_rule = policy["spec"]["ingress"][0]
        assert len(api_rule["from"]) == 2, api_rule  # the routers and the operator, as without pools
        assert all(peer for peer in api_rule["from"])
