"""Fixtures for the chart tests: the helm binary and the chart rendered once per values set."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart import helm as h

# Values sets that cover every branch of the templates; each is linted, rendered and validated.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "all-namespaces": {"operator": {"allNamespaces": True}},
    "peering-namespaced": {
        "operator": {"replicas": 2, "watchNamespace": "models", "peering": {"enabled": True}},
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
