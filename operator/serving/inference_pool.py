"""The Gateway API inference extension's InferencePool of an InferenceService (opt-in).

Clusters that run an inference gateway (kgateway, GKE's, llm-d's endpoint picker) route to a pool of
model-server pods rather than to a Service. With `spec.router.inferencePool: true` (or the operator's
`--inference-pool` default when the spec leaves it unset) Folio publishes one
`inference.networking.k8s.io/v1` InferencePool named after the InferenceService: its selector matches
the engine pods of every revision (they expose vLLM's metric names, which endpoint pickers read) on the
engine port. A gateway that routes through the pool bypasses Folio's router, and with it the canary split.

`endpointPickerRef` names the endpoint picker Service `{isvc}-epp` (what the upstream inferencepool chart
calls a pool's picker) when the operator has an endpoint-picker port; the schema it must satisfy is
vendored in `tests/serving/schemas/` with its version and source.
"""

from __future__ import annotations

from typing import Any

from folio.operator.k8s.names import (
    ENGINE_PORT,
    INFERENCE_POOL,
    PLURALS,
    component_labels,
    endpoint_picker_name,
    selector,
)

Obj = dict[str, Any]

API_VERSION, KIND = INFERENCE_POOL  # declared in k8s.names, with its plural
PLURAL = PLURALS[INFERENCE_POOL]
DEFAULT_PICKER_PORT = 9002  # the endpoint picker's ext-proc port in the upstream charts


def wanted(spec_value: bool | None, operator_default: bool) -> bool:
    """The spec decides when it says; otherwise the operator's default (the chart's value)."""
    return operator_default if spec_value is None else spec_value


def inference_pool(
    isvc: str, namespace: str, owner_reference: Obj, *, picker_port: int | None = DEFAULT_PICKER_PORT
) -> Obj:
    spec: Obj = {
        "selector": {"matchLabels": selector(isvc, "engine")},  # every revision's engine pods
        "targetPorts": [{"number": ENGINE_PORT}],
    }
    if picker_port:
        spec["endpointPickerRef"] = {
            "name": endpoint_picker_name(isvc), "kind": "Service", "port": {"number": picker_port},
            "failureMode": "FailClose",
        }  # fmt: skip
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": isvc, "namespace": namespace, "labels": component_labels(isvc, "engine"),
                     "ownerReferences": [owner_reference]},
        "spec": spec,
    }
