"""`spec.autoscaling.keda: true`: a KEDA ScaledObject per serving revision instead of Folio's autoscaler.

For clusters that standardize on KEDA. Each Stable or Canary revision whose weights are verified
gets a ScaledObject on its engine Deployment (whose ``replicas`` Folio then leaves to KEDA's HPA)
with a Prometheus trigger:

- Waiting: ``vllm:num_requests_waiting`` summed over the revision's pods, plus the requests the
  routers hold (so that a revision at zero, which has no engine to queue anything, is woken up);
- KVCache: ``vllm:kv_cache_usage_perc`` summed over its pods (KEDA's AverageValue divides by the
  replicas: the mean use, as Folio's own autoscaler reads it);
- InFlight: ``folio_router_in_flight`` plus the held requests of the routers for that revision.

``threshold`` is ``target``; ``minReplicaCount``/``maxReplicaCount`` are the spec's bounds (a canary
keeps at least one replica); the scale-down stabilization window and the cooldown before zero
are ``scaleDownDelay``. KEDA needs a Prometheus that scrapes the engines and routers: the
analysis' ``spec.rollout.analysis.prometheus.url``. Checked against KEDA's own CRD schema in the
tests (`tests/serving/vendor/keda.sh_scaledobjects.yaml`, KEDA 2.16.1).
"""

from __future__ import annotations

import math
from typing import Any

from folio.operator.k8s.names import SCALED_OBJECT, component_labels, engine_name
from folio.operator.serving.errors import PlanningError
from folio.operator.spec import AutoscalingSpec, InferenceServiceSpec, RevisionRole

API_VERSION, KIND = SCALED_OBJECT
POLLING_S = 15
MAX_STABILIZATION_S = 3600  # the HPA's limit

Obj = dict[str, Any]


def enabled(spec: InferenceServiceSpec) -> bool:
    return spec.autoscaling is not None and spec.autoscaling.keda


def scaled_by_keda(spec: InferenceServiceSpec, role: RevisionRole, pull_weights: bool) -> bool:
    """Whether KEDA owns this revision's replicas (its Deployment's ``replicas`` is left out then)."""
    return enabled(spec) and role in ("Stable", "Canary") and not pull_weights


def check(spec: InferenceServiceSpec) -> None:
    """Raise `PlanningError` when KEDA is asked for but has nothing to query."""
    if enabled(spec) and spec.rollout.analysis.prometheus is None:
        raise PlanningError(
            "KedaNeedsPrometheus",
            "spec.autoscaling.keda needs spec.rollout.analysis.prometheus.url: the Prometheus that KEDA "
            "queries for the engines' and routers' metrics",
        )


def query(auto: AutoscalingSpec, namespace: str, isvc: str, revision: str) -> str:
    pods = f'namespace="{namespace}",pod=~"{engine_name(isvc, revision)}-.*"'
    routers = f'namespace="{namespace}",isvc="{isvc}"'
    held = f"sum(folio_router_held_requests{{{routers}}} or vector(0))"
    if auto.metric == "Waiting":
        return f"sum(vllm:num_requests_waiting{{{pods}}} or vector(0)) + {held}"
    if auto.metric == "KVCache":
        return f"sum(vllm:kv_cache_usage_perc{{{pods}}} or vector(0))"
    return f'sum(folio_router_in_flight{{{routers},revision="{revision}"}} or vector(0)) + {held}'


def scaled_object(spec: InferenceServiceSpec, namespace: str, isvc: str, revision: str, role: RevisionRole,
                  owner: Obj, target: tuple[str, str] = ("apps/v1", "Deployment")) -> Obj:
    """``target``: (apiVersion, kind) of the revision's engines, a Deployment or a LeaderWorkerSet (whose scale
    subresource counts groups)."""
    auto = spec.autoscaling
    prometheus = spec.rollout.analysis.prometheus
    assert auto is not None and prometheus is not None, "check() first"
    delay = math.ceil(auto.scale_down_delay_seconds)
    name = engine_name(isvc, revision)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "labels": component_labels(isvc, "engine", revision),
                     "ownerReferences": [owner]},
        "spec": {
            "scaleTargetRef": {"apiVersion": target[0], "kind": target[1], "name": name},
            "minReplicaCount": max(auto.min_replicas, 1) if role == "Canary" else auto.min_replicas,
            "maxReplicaCount": auto.max_replicas,
            "pollingInterval": POLLING_S,
            "cooldownPeriod": delay,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                "scaleDown": {"stabilizationWindowSeconds": min(delay, MAX_STABILIZATION_S)},
            }}},
            "triggers": [{
                "type": "prometheus",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": prometheus.url,
                    "query": query(auto, namespace, isvc, revision),
                    "threshold": f"{auto.target:g}",
                    "activationThreshold": "0",
                },
            }],
        },
    }  # fmt: skip
