"""The endpoint pickers the operator deploys for its InferencePools (`--endpoint-picker-image`): one per pool,
named as the pool's `endpointPickerRef`, gone with its pool, reachable by the gateway only."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from folio.operator.serving.endpoint_picker import EXT_PROC_PORT, HEALTH_PORT, METRICS_PORT
from folio.operator.serving.inference_pool import KIND as POOL
from folio.operator.serving.objects import PlanSettings
from tests.serving.helpers import make_spec, revision
from tests.serving.test_inference_pool import GATEWAY, _planned, _two_revisions
from tests.support.pss import hardening_gaps, violations

IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.0.0"
PICKERS = PlanSettings(endpoint_picker_image=IMAGE, endpoint_picker_cluster_role="folio-endpoint-picker")
GATEWAY_NS = {"kubernetes.io/metadata.name": "gateway-system"}
GATEWAY_PODS = {"app": "inference-gateway"}

Obj = dict[str, Any]


def _canary(settings: PlanSettings = PICKERS, **router: Any) -> tuple[dict[tuple[str, str], Obj], list[str]]:
    spec, stable, canary = _two_revisions(**router)
    objs = _planned(spec, [stable, canary], {stable.name: 90, canary.name: 10}, settings)
    keyed = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    assert len(keyed) == len(objs), "duplicate objects in the plan"
    return keyed, [stable.name, canary.name]


def _pickers(objs: dict[tuple[str, str], Obj]) -> set[tuple[str, str]]:
    return {k for k, o in objs.items() if o["metadata"]["labels"].get("app.kubernetes.io/component") == "epp"}


def test_a_canary_gets_a_picker_per_pool_and_one_account() -> None:
    objs, revisions = _canary(gateway=GATEWAY)
    assert _pickers(objs) == {
        *((kind, f"chat-{rev}-epp") for rev in revisions for kind in ("Deployment", "Service")),
        ("ServiceAccount", "chat-epp"), ("RoleBinding", "chat-epp"), ("NetworkPolicy", "chat-epp"),
    }
    for rev in revisions:  # each pool's reference names its own picker's Service, on its port
        ref = objs[(POOL, f"chat-{rev}")]["spec"]["endpointPickerRef"]
        service = objs[("Service", ref["name"])]
        assert ref["port"]["number"] in {p["port"] for p in service["spec"]["ports"]}
    for key in _pickers(objs):
        obj = objs[key]
        kubernetes_validate.validate(obj, "1.30", strict=True)
        assert obj["metadata"]["ownerReferences"][0]["uid"] == "uid-1"  # applied and pruned like the rest
        assert obj["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "folio"


def test_the_picker_serves_its_own_pool_with_hardened_defaults() -> None:
    objs, (stable, _) = _canary()
    deployment = objs[("Deployment", f"chat-{stable}-epp")]
    labels = deployment["metadata"]["labels"]
    assert (labels["app.kubernetes.io/component"], labels["serving.folio.dev/revision"]) == ("epp", stable)
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]["spec"]
    assert violations(pod) == [] and hardening_gaps(pod) == []
    assert pod["serviceAccountName"] == "chat-epp" and pod["automountServiceAccountToken"] is True
    (container,) = pod["containers"]
    assert container["image"] == IMAGE
    args = dict(zip(container["args"][::2], container["args"][1::2], strict=True))
    assert args == {
        "--pool-name": f"chat-{stable}", "--pool-namespace": "ml", "--pool-group": "inference.networking.k8s.io",
        "--grpc-port": str(EXT_PROC_PORT), "--grpc-health-port": str(HEALTH_PORT), "--metrics-port": str(METRICS_PORT),
        "--model-server-metrics-port": "8001",  # the engines' /metrics port, not the API port the pool targets
    }
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": HEALTH_PORT, "service": "inference-extension"}
    # its pods are not the pool's: the pool selects engine pods only
    pool = objs[(POOL, f"chat-{stable}")]["spec"]["selector"]["matchLabels"]
    assert not pool.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    service = objs[("Service", f"chat-{stable}-epp")]["spec"]
    assert service["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["ports"][0] == {"name": "grpc-ext-proc", "port": 9002, "targetPort": "grpc", "protocol": "TCP",
                                   "appProtocol": "http2"}


def test_the_account_is_bound_to_the_charts_role_in_its_namespace_only() -> None:
    objs, _ = _canary()
    binding = objs[("RoleBinding", "chat-epp")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "folio-endpoint-picker"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "chat-epp", "namespace": "ml"}]
    assert not [k for k in objs if k[0] in ("Role", "ClusterRole", "ClusterRoleBinding")]


@pytest.mark.parametrize(
    "settings",
    [PlanSettings(), PlanSettings(endpoint_picker_image=IMAGE, endpoint_picker_port=0)],
    ids=["no-image", "no-port"],
)
def test_no_picker_without_an_image_or_a_port(settings: PlanSettings) -> None:
    objs, _ = _canary(settings)
    assert _pickers(objs) == set()
    assert [k for k in objs if k[0] == POOL]  # the pools are still published
    engine_policy = objs[("NetworkPolicy", "chat-engine")]
    assert all("epp" not in str(rule["from"]) for rule in engine_policy["spec"]["ingress"])


def test_no_picker_without_pools() -> None:
    spec = make_spec()
    objs = _planned(spec, [revision(spec)], settings=PICKERS)
    assert not [o for o in objs if o["metadata"]["name"].endswith("-epp")]


def test_after_a_rollback_the_failed_revisions_picker_is_gone() -> None:
    spec, stable, canary = _two_revisions(gateway=GATEWAY)
    canary.role = "Failed"
    objs = _planned(spec, [stable, canary], {stable.name: 100}, PICKERS)
    assert sorted(o["metadata"]["name"] for o in objs if o["kind"] in ("Deployment", "Service")
                  and o["metadata"]["name"].endswith("-epp")) == [f"chat-{stable.name}-epp"] * 2


# ------------------------------------------------------------------------------------ network policy


def _policies(**network_policy: Any) -> tuple[Obj, Obj, dict[tuple[str, str], Obj]]:
    spec, stable, canary = _two_revisions()
    spec = make_spec(router=spec.router.to_wire(), engine=spec.engine.to_wire(), networkPolicy=network_policy)
    objs = {(o["kind"], o["metadata"]["name"]): o
            for o in _planned(spec, [stable, canary], {stable.name: 100}, PICKERS)}
    return objs[("NetworkPolicy", "chat-engine")], objs[("NetworkPolicy", "chat-epp")], objs


def _labels(objs: dict[tuple[str, str], Obj], name: str) -> dict[str, str]:
    return objs[("Deployment", name)]["spec"]["template"]["metadata"]["labels"]


def test_engines_admit_their_pickers_to_the_metrics_port_only() -> None:
    engine_policy, _, objs = _policies()
    kubernetes_validate.validate(engine_policy, "1.30", strict=True)
    picker = next(_labels(objs, n) for k, n in objs if k == "Deployment" and n.endswith("-epp"))
    admitted = {p["port"] for rule in engine_policy["spec"]["ingress"] for peer in rule["from"]
                if set(peer) == {"podSelector"} and peer["podSelector"]["matchLabels"].items() <= picker.items()
                for p in rule["ports"]}
    assert admitted == {8001}
    # another InferenceService's pickers do not match
    (peer,) = [peer for rule in engine_policy["spec"]["ingress"] for peer in rule["from"]
               if peer.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "epp"]
    assert not peer["podSelector"]["matchLabels"].items() <= {**picker, "app.kubernetes.io/instance": "x"}.items()


def test_the_gateway_reaches_the_pickers_ext_proc_port_and_scrapers_their_metrics() -> None:
    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    _, policy, objs = _policies(gatewayNamespaceLabels=GATEWAY_NS, gatewayPodLabels=GATEWAY_PODS,
                                metricsNamespaceLabels=monitoring)
    kubernetes_validate.validate(policy, "1.30", strict=True)
    pickers = [_labels(objs, n) for k, n in objs if k == "Deployment" and n.endswith("-epp")]
    assert len(pickers) == 2
    assert all(policy["spec"]["podSelector"]["matchLabels"].items() <= p.items() for p in pickers)
    assert not policy["spec"]["podSelector"]["matchLabels"].items() <= _labels(objs, "chat").items()
    assert policy["spec"]["ingress"] == [
        {"from": [{"namespaceSelector": {"matchLabels": GATEWAY_NS}, "podSelector": {"matchLabels": GATEWAY_PODS}}],
         "ports": [{"protocol": "TCP", "port": EXT_PROC_PORT}]},
        {"from": [{"namespaceSelector": {"matchLabels": monitoring}}], "ports": [{"protocol": "TCP", "port": METRICS_PORT}]},
    ]


def test_without_gateway_labels_nothing_reaches_the_pickers() -> None:
    _, policy, _ = _policies()
    assert policy["spec"]["policyTypes"] == ["Ingress"] and policy["spec"]["ingress"] == []


def test_no_picker_policy_when_the_spec_opts_out() -> None:
    spec, stable, _ = _two_revisions()
    spec = make_spec(router=spec.router.to_wire(), engine=spec.engine.to_wire(), networkPolicy={"enabled": False})
    objs = _planned(spec, [stable], {stable.name: 100}, PICKERS)
    assert not [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-epp")]
