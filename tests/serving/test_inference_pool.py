"""The opt-in InferencePools (one per running revision) and the HTTPRoute that splits a Gateway's traffic
over them by status.traffic, checked against the upstream CRDs' schemas and CEL rules (vendored beside)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from folio.operator.k8s.names import ENGINE_PORT, MANAGED_KINDS
from folio.operator.router.app import PROXIED
from folio.operator.serving import http_route
from folio.operator.serving.http_route import API_PATHS
from folio.operator.serving.inference_pool import API_VERSION, KIND, PLURAL
from folio.operator.serving.objects import PlanSettings, objects
from folio.operator.serving.plan import Placement, plan
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus, RevisionStatus, TrafficTarget
from tests.serving.helpers import OWNER, make_spec, revision
from tests.test_crd import cel_errors

SCHEMAS = Path(__file__).parent / "schemas"
POOL_CRD = yaml.safe_load((SCHEMAS / "inference.networking.k8s.io_inferencepools.v1.yaml").read_text())
ROUTE_CRD = yaml.safe_load((SCHEMAS / "gateway.networking.k8s.io_httproutes.v1.yaml").read_text())
SCHEMA: dict[str, Any] = POOL_CRD["openAPIV3Schema"]
ROUTE_SCHEMA: dict[str, Any] = ROUTE_CRD["openAPIV3Schema"]
GATEWAY = {"name": "inference-gateway", "namespace": "gateway-system", "sectionName": "http"}
OTHER_ARGS = {"maxModelLen": 2048}  # a spec.engine.args change: a new revision


def upstream_errors(obj: dict[str, Any], schema: dict[str, Any] = SCHEMA) -> list[str]:
    """What an API server with the upstream CRD installed would refuse: schema first, then CEL."""
    validator = jsonschema.Draft4Validator(schema)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    return errors or list(cel_errors(schema, obj))


def pruned_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the API server would drop silently (not in the structural schema): a typo passes validation."""
    if isinstance(obj, dict) and "properties" in schema:
        out = [f"{path}.{k}" for k in obj if k not in schema["properties"]]
        for key, sub in schema["properties"].items():
            if key in obj:
                out += pruned_fields(obj[key], sub, f"{path}.{key}")
        return out
    if isinstance(obj, list) and "items" in schema:
        return [f for i, item in enumerate(obj) for f in pruned_fields(item, schema["items"], f"{path}[{i}]")]
    return []


def _spec(inference_pool: bool | None, **router: Any) -> InferenceServiceSpec:
    body: dict[str, Any] = {"replicas": 2, **router}
    if inference_pool is not None:
        body["inferencePool"] = inference_pool
    return make_spec(router=body)


def _planned(spec: InferenceServiceSpec, revisions: list[RevisionStatus], traffic: dict[str, int] | None = None,
             settings: PlanSettings | None = None) -> list[dict[str, Any]]:
    status = InferenceServiceStatus(
        revisions=revisions, traffic=[TrafficTarget(revision=r, weight=w) for r, w in (traffic or {}).items()]
    )
    return objects(plan("chat", spec, status, Placement.cluster()), OWNER, settings)


def _pools(spec: InferenceServiceSpec, settings: PlanSettings | None = None) -> list[dict[str, Any]]:
    return [o for o in _planned(spec, [revision(spec)], settings=settings) if o["kind"] == KIND]


def _two_revisions(**router: Any) -> tuple[InferenceServiceSpec, RevisionStatus, RevisionStatus]:
    """A stable revision and a canary of a changed spec (the spec now names the canary's args)."""
    stable_spec = _spec(True, **router)
    canary_spec = make_spec(router=stable_spec.router.to_wire(), engine={**stable_spec.engine.to_wire(),
                                                                         "args": OTHER_ARGS})
    stable, canary = revision(stable_spec, "Stable"), revision(canary_spec, "Canary")
    assert stable.name != canary.name
    return canary_spec, stable, canary


def _route(objs: list[dict[str, Any]]) -> dict[str, Any]:
    (route,) = [o for o in objs if o["kind"] == http_route.KIND]
    return route


def _route_weights(objs: list[dict[str, Any]]) -> dict[str, int]:
    (rule,) = _route(objs)["spec"]["rules"]
    return {ref["name"]: ref["weight"] for ref in rule["backendRefs"]}


# ---------------------------------------------------------------------------------------------- pools


def test_the_vendored_schemas_are_the_v1_apis_the_plan_targets() -> None:
    assert f"{POOL_CRD['group']}/{POOL_CRD['version']}" == API_VERSION
    assert (POOL_CRD["kind"], POOL_CRD["plural"]) == (KIND, PLURAL)
    assert POOL_CRD["bundleVersion"].startswith("v1.")
    assert f"{ROUTE_CRD['group']}/{ROUTE_CRD['version']}" == http_route.API_VERSION
    assert (ROUTE_CRD["kind"], ROUTE_CRD["plural"]) == (http_route.KIND, http_route.PLURAL)
    assert (API_VERSION, KIND) in MANAGED_KINDS and (http_route.API_VERSION, http_route.KIND) in MANAGED_KINDS


def test_opted_in_service_publishes_a_valid_pool_over_its_revisions_engine_pods() -> None:
    spec = _spec(True)
    rev = revision(spec)
    (pool,) = _pools(spec)
    assert upstream_errors(pool) == [] and pruned_fields(pool, SCHEMA) == []
    assert pool["apiVersion"] == API_VERSION and pool["metadata"]["name"] == f"chat-{rev.name}"
    assert pool["metadata"]["namespace"] == "ml"
    assert pool["metadata"]["ownerReferences"][0]["uid"] == "uid-1"  # deleted with its InferenceService
    assert pool["spec"]["targetPorts"] == [{"number": ENGINE_PORT}]
    deployments = [o for o in _planned(spec, [rev]) if o["kind"] == "Deployment"]
    (engine,) = [o for o in deployments if o["metadata"]["name"] == f"chat-{rev.name}"]
    selector = pool["spec"]["selector"]["matchLabels"]
    assert selector.items() <= engine["spec"]["template"]["metadata"]["labels"].items()
    router = next(o for o in deployments if o["metadata"]["name"] == "chat")
    assert not selector.items() <= router["spec"]["template"]["metadata"]["labels"].items()
    assert pool["spec"]["endpointPickerRef"] == {  # its own picker: an upstream picker serves one pool
        "name": f"chat-{rev.name}-epp", "kind": "Service", "port": {"number": 9002}, "failureMode": "FailClose"
    }


def test_one_pool_per_running_revision_each_selecting_its_own_engines_only() -> None:
    spec, stable, canary = _two_revisions()
    retiring = revision(make_spec(engine={**spec.engine.to_wire(), "args": {"maxModelLen": 1024}}), "Retiring")
    failed = revision(make_spec(engine={**spec.engine.to_wire(), "args": {"maxModelLen": 512}}), "Failed")
    objs = _planned(spec, [stable, canary, retiring, failed], {stable.name: 75, canary.name: 25})
    pools = {o["metadata"]["name"]: o for o in objs if o["kind"] == KIND}
    running = [stable, canary, retiring]
    assert set(pools) == {f"chat-{r.name}" for r in running}  # a failed revision runs nothing: no pool
    engines = {o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"]
               for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] != "chat"}
    for name, pool in pools.items():
        assert upstream_errors(pool) == []
        selector = pool["spec"]["selector"]["matchLabels"].items()
        # disjoint: each pool selects its own revision's engine pods and no other revision's
        assert [e for e, labels in engines.items() if selector <= labels.items()] == [name]


@pytest.mark.parametrize(
    ("spec_value", "operator_default", "published"),
    [(None, False, False), (None, True, True), (True, False, True), (False, True, False)],
)
def test_the_spec_decides_and_the_operator_default_fills_in(
    spec_value: bool | None, operator_default: bool, published: bool
) -> None:
    pools = _pools(_spec(spec_value), PlanSettings(inference_pool=operator_default))
    assert len(pools) == (1 if published else 0)


def test_without_an_endpoint_picker_port_the_reference_is_left_out() -> None:
    (pool,) = _pools(_spec(True), PlanSettings(endpoint_picker_port=0))
    assert "endpointPickerRef" not in pool["spec"]
    assert upstream_errors(pool) == []


def test_the_check_catches_what_the_upstream_api_server_refuses() -> None:
    (pool,) = _pools(_spec(True))
    broken = yaml.safe_load(yaml.safe_dump(pool))
    broken["spec"]["targetPorts"] = [{"number": 8000}, {"number": 8000}]
    assert upstream_errors(broken) == ["spec.targetPorts: port number must be unique"]
    broken["spec"]["targetPorts"] = []
    assert upstream_errors(broken)
    no_port = yaml.safe_load(yaml.safe_dump(pool))
    del no_port["spec"]["endpointPickerRef"]["port"]
    assert upstream_errors(no_port) == [
        "spec.endpointPickerRef: port is required when kind is 'Service' or unspecified (defaults to 'Service')"
    ]


# ---------------------------------------------------------------------------------------------- route


def test_without_a_gateway_the_pools_are_published_and_no_route() -> None:
    spec, stable, canary = _two_revisions()
    objs = _planned(spec, [stable, canary], {stable.name: 90, canary.name: 10})
    assert len([o for o in objs if o["kind"] == KIND]) == 2
    assert not [o for o in objs if o["kind"] == http_route.KIND]


def test_the_route_attaches_to_the_gateway_and_sends_the_api_paths_to_the_pools() -> None:
    spec, stable, canary = _two_revisions(gateway=GATEWAY)
    route = _route(_planned(spec, [stable, canary], {stable.name: 95, canary.name: 5}))
    assert upstream_errors(route, ROUTE_SCHEMA) == [] and pruned_fields(route, ROUTE_SCHEMA) == []
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1" and route["metadata"]["name"] == "chat"
    assert route["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                            "name": "inference-gateway", "namespace": "gateway-system",
                                            "sectionName": "http"}]
    (rule,) = route["spec"]["rules"]
    # the OpenAI API alone: an engine's other paths (its runtime adapter endpoints) are not the Gateway's
    assert rule["matches"] == [{"path": {"type": "Exact", "value": p}}
                               for p in ("/v1/completions", "/v1/chat/completions", "/v1/models")]
    assert set(API_PATHS) == set(PROXIED), "the paths Folio's router serves"
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": f"chat-{stable.name}", "weight": 95},
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": f"chat-{canary.name}", "weight": 5},
    ]


def test_a_gateway_in_the_services_namespace_and_any_listener() -> None:
    spec, stable, _ = _two_revisions(gateway={"name": "gw"})
    route = _route(_planned(spec, [stable], {stable.name: 100}))
    assert route["spec"]["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"}]
    assert upstream_errors(route, ROUTE_SCHEMA) == []


@pytest.mark.parametrize("weight", [5, 25, 50])
def test_route_weights_are_status_traffic_at_each_canary_step(weight: int) -> None:
    spec, stable, canary = _two_revisions(gateway=GATEWAY)
    objs = _planned(spec, [stable, canary], {stable.name: 100 - weight, canary.name: weight})
    assert _route_weights(objs) == {f"chat-{stable.name}": 100 - weight, f"chat-{canary.name}": weight}
    assert upstream_errors(_route(objs), ROUTE_SCHEMA) == []


def test_a_canary_not_yet_in_status_traffic_gets_weight_zero() -> None:
    spec, stable, canary = _two_revisions(gateway=GATEWAY)
    objs = _planned(spec, [stable, canary], {stable.name: 100})  # still starting: its pool, no share yet
    assert _route_weights(objs) == {f"chat-{stable.name}": 100, f"chat-{canary.name}": 0}
    assert upstream_errors(_route(objs), ROUTE_SCHEMA) == []


def test_after_a_rollback_stable_has_it_all_and_the_failed_canary_no_pool() -> None:
    spec, stable, canary = _two_revisions(gateway=GATEWAY)
    canary.role = "Failed"
    objs = _planned(spec, [stable, canary], {stable.name: 100})
    assert _route_weights(objs) == {f"chat-{stable.name}": 100}
    assert [o["metadata"]["name"] for o in objs if o["kind"] == KIND] == [f"chat-{stable.name}"]


def test_after_a_promotion_the_retiring_revision_keeps_its_pool_at_weight_zero() -> None:
    spec, old, new = _two_revisions(gateway=GATEWAY)
    old.role, new.role = "Retiring", "Stable"
    objs = _planned(spec, [new, old], {new.name: 100})
    assert _route_weights(objs) == {f"chat-{new.name}": 100, f"chat-{old.name}": 0}
    assert upstream_errors(_route(objs), ROUTE_SCHEMA) == []


def test_the_route_check_catches_what_the_upstream_api_server_refuses() -> None:
    spec, stable, _ = _two_revisions(gateway=GATEWAY)
    route = _route(_planned(spec, [stable], {stable.name: 100}))
    broken = yaml.safe_load(yaml.safe_dump(route))
    broken["spec"]["rules"][0]["backendRefs"][0]["weight"] = -1
    assert upstream_errors(broken, ROUTE_SCHEMA)
    service = yaml.safe_load(yaml.safe_dump(route))
    service["spec"]["rules"][0]["backendRefs"][0].update(group="", kind="Service")
    assert upstream_errors(service, ROUTE_SCHEMA) == [
        "spec.rules[0].backendRefs[0]: Must have port for Service reference"
    ]
    typo = yaml.safe_load(yaml.safe_dump(route))
    typo["spec"]["rules"][0]["backendRefs"][0]["wieght"] = 1
    assert pruned_fields(typo, ROUTE_SCHEMA) == [".spec.rules[0].backendRefs[0].wieght"]
