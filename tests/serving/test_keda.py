"""`autoscaling.keda: true`: ScaledObjects checked against KEDA's own CRD schema (vendored, KEDA 2.16.1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.serving.helpers import make_spec, objects_by_key, problems, revision

CRD = yaml.safe_load((Path(__file__).parent / "vendor" / "keda.sh_scaledobjects.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
PROMETHEUS = {"analysis": {"prometheus": {"url": "http://prometheus.monitoring:9090"}}}


def keda_spec(**auto: Any) -> Any:
    return make_spec(autoscaling={"minReplicas": 0, "maxReplicas": 6, "metric": "Waiting", "target": 3,
                                  "scaleDownDelay": "10m", "keda": True, **auto}, rollout=PROMETHEUS)


def pruned(obj: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Fields the API server would drop (structural pruning): every key must be in the schema."""
    if isinstance(obj, dict) and "properties" in schema:
        found = []
        for key, value in obj.items():
            if key not in schema["properties"]:
                found.append(f"{where}.{key}")
            else:
                found += pruned(value, schema["properties"][key], f"{where}.{key}")
        return found
    if isinstance(obj, list) and "items" in schema:
        return [p for i, item in enumerate(obj) for p in pruned(item, schema["items"], f"{where}[{i}]")]
    return []


def test_scaled_object_per_serving_revision_valid_for_keda() -> None:
    spec = keda_spec()
    stable = revision(spec)
    objs = objects_by_key(spec, stable)
    scaled = objs[("ScaledObject", f"chat-{stable.name}")]
    jsonschema.validate(scaled, SCHEMA)
    assert pruned(scaled, SCHEMA) == [] and pruned(scaled["metadata"], {}) == []
    assert scaled["apiVersion"] == f"{CRD['spec']['group']}/{CRD['spec']['versions'][0]['name']}"
    assert scaled["kind"] == CRD["spec"]["names"]["kind"]
    body = scaled["spec"]
    assert body["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"chat-{stable.name}"}
    assert (body["minReplicaCount"], body["maxReplicaCount"], body["cooldownPeriod"]) == (0, 6, 600)
    assert body["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"] == {
        "stabilizationWindowSeconds": 600}
    [trigger] = body["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert meta["serverAddress"] == "http://prometheus.monitoring:9090" and meta["threshold"] == "3"
    assert f'vllm:num_requests_waiting{{namespace="ml",pod=~"chat-{stable.name}-.*"}}' in meta["query"]
    assert 'folio_router_held_requests{namespace="ml",isvc="chat"}' in meta["query"]  # wakes it from zero
    assert all(isinstance(v, str) for v in meta.values())  # the CRD's metadata is a map of strings
    assert body["minReplicaCount"] <= body["maxReplicaCount"]
    deployment = objs[("Deployment", f"chat-{stable.name}")]
    assert "replicas" not in deployment["spec"], "KEDA's HPA owns the replicas"
    assert ("Role", "chat-router") not in objs, "routers bind the chart's read-only ClusterRole; none is made"


@pytest.mark.parametrize("metric, target, needle", [
    ("InFlight", 4, 'folio_router_in_flight{namespace="ml",isvc="chat",revision='),
    ("KVCache", 0.8, "vllm:kv_cache_usage_perc{"),
])  # fmt: skip
def test_other_metrics_query_their_series(metric: str, target: float, needle: str) -> None:
    spec = keda_spec(metric=metric, target=target)
    stable = revision(spec)
    scaled = objects_by_key(spec, stable)[("ScaledObject", f"chat-{stable.name}")]
    jsonschema.validate(scaled, SCHEMA)
    assert needle in scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert scaled["spec"]["triggers"][0]["metadata"]["threshold"] == f"{target:g}"


def test_canary_keeps_a_replica_and_nothing_scales_before_weights() -> None:
    spec = keda_spec()
    stable, canary = revision(spec), revision(make_spec(engine={"args": {"maxModelLen": 2048}}), role="Canary")
    objs = objects_by_key(spec, stable, canary)
    assert objs[("ScaledObject", f"chat-{canary.name}")]["spec"]["minReplicaCount"] == 1
    pulling = revision(spec, weights_ready=False)
    objs = objects_by_key(spec, pulling)
    assert not [k for k in objs if k[0] == "ScaledObject"]
    assert objs[("Deployment", f"chat-{pulling.name}")]["spec"]["replicas"] == 0
    plain = make_spec(autoscaling={"minReplicas": 0, "maxReplicas": 6})
    assert not [k for k in objects_by_key(plain, revision(plain)) if k[0] == "ScaledObject"]


def test_keda_without_prometheus_is_a_planning_error() -> None:
    (problem,) = problems(make_spec(autoscaling={"keda": True}))
    assert (problem.path, problem.reason) == ("spec.autoscaling.keda", "KedaNeedsPrometheus")
    assert "spec.rollout.analysis.prometheus.url" in problem.message
    assert problems(keda_spec()) == []
