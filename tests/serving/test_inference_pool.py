"""The opt-in InferencePool, checked against the upstream CRD's schema and CEL rules (vendored beside)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from folio.operator.k8s.names import ENGINE_PORT
from folio.operator.serving.inference_pool import API_VERSION, KIND, PLURAL
from folio.operator.serving.objects import PlanSettings, objects
from folio.operator.serving.plan import Placement, plan
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus
from tests.serving.helpers import OWNER, make_spec, revision
from tests.test_crd import cel_errors

VENDORED = yaml.safe_load((Path(__file__).parent / "schemas/inference.networking.k8s.io_inferencepools.v1.yaml").read_text())
SCHEMA: dict[str, Any] = VENDORED["openAPIV3Schema"]


def upstream_errors(obj: dict[str, Any]) -> list[str]:
    """What an API server with the upstream CRD installed would refuse: schema first, then CEL."""
    validator = jsonschema.Draft4Validator(SCHEMA)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    return errors or list(cel_errors(SCHEMA, obj))


def _spec(inference_pool: bool | None) -> InferenceServiceSpec:
    router: dict[str, Any] = {"replicas": 2}
    if inference_pool is not None:
        router["inferencePool"] = inference_pool
    return make_spec(router=router)


def _pools(spec: InferenceServiceSpec, settings: PlanSettings | None = None) -> list[dict[str, Any]]:
    serving = plan("chat", spec, InferenceServiceStatus(revisions=[revision(spec)]), Placement.cluster())
    return [o for o in objects(serving, OWNER, settings) if o["kind"] == KIND]


def test_the_vendored_schema_is_the_v1_api_the_plan_targets() -> None:
    assert f"{VENDORED['group']}/{VENDORED['version']}" == API_VERSION
    assert (VENDORED["kind"], VENDORED["plural"]) == (KIND, PLURAL)
    assert VENDORED["bundleVersion"].startswith("v1.")


def test_opted_in_service_publishes_a_valid_pool_over_its_engine_pods() -> None:
    spec = _spec(True)
    (pool,) = _pools(spec)
    assert upstream_errors(pool) == []
    assert pool["apiVersion"] == API_VERSION and pool["metadata"]["name"] == "chat"
    assert pool["metadata"]["namespace"] == "ml"
    assert pool["metadata"]["ownerReferences"][0]["uid"] == "uid-1"  # deleted with its InferenceService
    assert pool["spec"]["targetPorts"] == [{"number": ENGINE_PORT}]
    # the selector is exactly what every revision's engine pods carry, and nothing else's
    deployments = [o for o in _objects(spec) if o["kind"] == "Deployment"]
    engines = [o for o in deployments if o["metadata"]["name"] != "chat"]  # the router is named after the service
    assert engines
    selector = pool["spec"]["selector"]["matchLabels"]
    for deployment in engines:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
    router = next(o for o in deployments if o["metadata"]["name"] == "chat")
    assert not selector.items() <= router["spec"]["template"]["metadata"]["labels"].items()
    assert pool["spec"]["endpointPickerRef"] == {
        "name": "chat-epp", "kind": "Service", "port": {"number": 9002}, "failureMode": "FailClose"
    }


def _objects(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    serving = plan("chat", spec, InferenceServiceStatus(revisions=[revision(spec)]), Placement.cluster())
    return objects(serving, OWNER)


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
