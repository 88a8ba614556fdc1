"""Fixtures for the chart tests: the helm binary and the chart rendered once per values set."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from folio.engine.distributed.parallel_state import collective_metrics
from folio.engine.outputs import CompletionOutput, EngineStats, RequestOutput
from folio.engine.server.metrics import ServerMetrics
from folio.operator.controller import metrics as operator_metrics
from folio.operator.router.metrics import RouterMetrics
from tests.chart import helm as h

# Values sets that cover every branch of the templates; each is linted, rendered and validated.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "all-namespaces": {"operator": {"allNamespaces": True}},
    "peering-namespaced": {  # peering on by default with more than one replica
        "operator": {"replicas": 2, "watchNamespace": "models"},
    },
    "peering-cluster": {
        "operator": {"replicas": 2, "allNamespaces": True, "peering": {"enabled": True, "name": "folio-ha"}},
    },
    "observability": {
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
        "grafana": {"dashboard": {"enabled": True, "namespace": "monitoring"}},
        "tests": {"inferenceService": "chat", "namespace": "models", "model": "smollm2"},
        "imagePullSecrets": [{"name": "regcred"}],
        "image": {"repository": "registry.example/folio", "tag": "1.2.3", "pullPolicy": "Always"},
        "operator": {
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "system-cluster-critical",
            "extraArgs": ["--verbose"],
            "extraEnv": [{"name": "FOLIO_EXTRA", "value": "1"}],
            "inferencePool": {"enabled": True, "endpointPickerPort": 9100,
                              "endpointPickerImage": "registry.example/epp:v1.0.0"},
            "podAnnotations": {"example.com/team": "ml"},
        },
    },
    "bring-your-own": {
        "crds": {"enabled": False},
        "rbac": {"create": False},
        "serviceAccount": {"create": False, "name": "folio-operator"},
        "fullnameOverride": "folio",
    },
}


@pytest.fixture(scope="session")
def helm() -> str:
    path = h.find_helm()
    if path is None:
        pytest.skip("helm not found: `make tools` installs it into .venv/tools/bin")
    return path


@pytest.fixture(scope="session")
def rendered(helm: str) -> dict[str, list[h.Obj]]:
    """Each values set rendered once (with the chart's crds/ folder), for all tests to share."""
    return {name: h.template(helm, values, include_crds=True) for name, values in VALUE_SETS.items()}


# Labels Prometheus adds to every target, and those the engines' ServiceMonitor relabels in.
TARGET_LABELS = {"namespace", "pod", "service", "job", "instance", "container", "endpoint"}
ENGINE_TARGET_LABELS = {"isvc", "revision"}

METRIC_NAME = re.compile(r"\b(folio_[a-z0-9_]+|vllm:[a-z0-9_]+)(\{[^}]*\})?")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
SUM_BY = re.compile(r"by \(([^)]*)\)")


def scraped(text: str) -> dict[str, set[str]]:
    """Series names in a Prometheus text exposition, with the labels each carries."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


@pytest.fixture(scope="module")
def series() -> dict[str, set[str]]:
    """Drive the real engine and router metrics once each, then read what a scrape shows."""
    stats = EngineStats(num_running=1, num_waiting=0, kv_cache_usage=0.5, num_preemptions_total=0,
                        prefix_cache_queries_total=0, prefix_cache_hits_total=0)
    engine = ServerMetrics("smollm2", lambda: stats)  # folio_engine_request_errors_total starts at 0
    engine.on_added("r", prompt_tokens=3)
    for n, reason in ((1, None), (2, "stop")):  # step outputs: the tokens new in each step
        out = CompletionOutput(index=0, text="x" * n, token_ids=list(range(n)), finish_reason=reason)
        engine.on_output(RequestOutput("r", "p", [1, 2, 3], [out], finished=reason is not None), time.monotonic())
    router = RouterMetrics("chat")
    router.set_weights({"r1": 90, "r2": 10})
    router.attempt_started("r2")
    router.first_byte("r2", 0.01)
    router.attempt_finished("r2", "503", 0.02)
    router.retry("r2", "r1")
    router.shadowed("r2", "200", 0.02)
    router.replica_ejected("r2", "http://10.0.0.2:8000", True)
    router.overflowed("200")
    router.migrated("r2", "reset", "no_replica")
    router.seam_gap("r2", 0.2)
    collective_metrics(engine.registry, "smollm2")("all_reduce", 0.001)  # what a tensor-parallel engine adds
    found = {name: labels | TARGET_LABELS | ENGINE_TARGET_LABELS
             for name, labels in scraped(engine.render().decode()).items() if name.startswith(("vllm:", "folio_engine_"))}
    found |= {name: labels | TARGET_LABELS
              for name, labels in scraped(router.render().decode()).items() if name.startswith("folio_router_")}
    # The operator's metrics live in the default registry: create one child of each (no value changes).
    operator_metrics.RECONCILES.labels(trigger="timer", result="ok")
    operator_metrics.ERRORS.labels(reason="api_500")
    operator_metrics.DURATION.labels(trigger="timer")
    operator_metrics.APPLIED.labels(kind="Deployment", action="created")
    operator_metrics.REVISIONS_FAILED.labels(namespace="models", isvc="chat", reason="AnalysisFailed")
    operator_metrics.POLICY_SERVICES.labels(namespace="models", policy="fleet", phase="Running")
    operator_metrics.POLICY_HALTED.labels(namespace="models", policy="fleet")
    found |= {name: labels | TARGET_LABELS for name, labels in scraped(generate_latest(REGISTRY).decode()).items()
              if name.startswith(("folio_operator_", "folio_rollout_policy_"))}
    return found
