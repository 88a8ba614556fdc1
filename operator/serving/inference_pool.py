"""The Gateway API inference extension's InferencePools of an InferenceService (opt-in).

Clusters that run an inference gateway (kgateway, GKE's, llm-d's endpoint picker) route to a pool of
model-server pods rather than to a Service. With `spec.router.inferencePool: true` (or the operator's
`--inference-pool` default when the spec leaves it unset) Folio publishes one
`inference.networking.k8s.io/v1` InferencePool per running revision, `{isvc}-{revision}`: its selector
matches that revision's engine pods only (they expose vLLM's metric names, which endpoint pickers read)
on the engine port. One pool over every revision would let a gateway bypass the canary split; with a
pool per revision, the HTTPRoute of `folio.operator.serving.http_route` splits a Gateway's traffic over
them by `status.traffic`, the inference extension's own canary pattern. A retiring revision keeps its
pool (at weight 0) until it is dropped; the executor then prunes the pool.

Each pool's `endpointPickerRef` names its own endpoint picker Service `{isvc}-{revision}-epp` (the
upstream inferencepool chart's `{pool}-epp`: a picker serves exactly one pool) when the operator has an
endpoint-picker port; the schema it must satisfy is vendored in `tests/serving/schemas/` with its
version and source.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from folio.operator.k8s.names import (
    ENGINE_PORT,
    INFERENCE_POOL,
    PLURALS,
    component_labels,
    endpoint_picker_name,
    inference_pool_name,
    selector,
)

Obj = dict[str, Any]

API_VERSION, KIND = INFERENCE_POOL  # declared in k8s.names, with its plural
GROUP = API_VERSION.split("/")[0]
PLURAL = PLURALS[INFERENCE_POOL]
DEFAULT_PICKER_PORT = 9002  # the endpoint picker's ext-proc port in the upstream charts


def wanted(spec_value: bool | None, operator_default: bool) -> bool:
    """The spec decides when it says; otherwise the operator's default (the chart's value)."""
    return operator_default if spec_value is None else spec_value


def inference_pool(
    isvc: str, namespace: str, revision: str, owner_reference: Obj, *, picker_port: int | None = DEFAULT_PICKER_PORT
) -> Obj:
    """``revision``'s pool: its engine pods alone, so that a route's weight for it is its share."""
    spec: Obj = {
        "selector": {"matchLabels": selector(isvc, "engine", revision)},
        "targetPorts": [{"number": ENGINE_PORT}],
    }
    if picker_port:
        spec["endpointPickerRef"] = {
            "name": endpoint_picker_name(isvc, revision), "kind": "Service", "port": {"number": picker_port},
            "failureMode": "FailClose",
        }  # fmt: skip
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": inference_pool_name(isvc, revision), "namespace": namespace,
                     "labels": component_labels(isvc, "engine", revision), "ownerReferences": [owner_reference]},
        "spec": spec,
    }


def inference_pools(
    isvc: str, namespace: str, revisions: Iterable[str], owner_reference: Obj, *,
    picker_port: int | None = DEFAULT_PICKER_PORT,
) -> list[Obj]:  # fmt: skip
    """One pool per running revision (Stable, Canary, Retiring), in the plan's order."""
    return [inference_pool(isvc, namespace, rev, owner_reference, picker_port=picker_port) for rev in revisions]
