"""Names Folio gives in a cluster, the namespace it acts in, and the client's paths; and that no other
module spells one out."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from folio.operator.k8s import names
from folio.operator.k8s.client import path
from folio.operator.k8s.names import (
    HTTP_ROUTE,
    INFERENCE_POOL,
    MANAGED_KINDS,
    PLURALS,
    SCALED_OBJECT,
    component_labels,
    endpoint_picker_name,
    engine_name,
    has_labels,
    http_route_name,
    inference_pool_name,
    network_policy_name,
    override_annotation,
    revision_of_service,
    selector,
)

OPERATOR = Path(__file__).resolve().parents[2] / "operator"

# Spellings that belong to operator/k8s/names.py alone, each with what to use instead.
SPELLED_OUT = {
    r'\}-epp"': "names.endpoint_picker_name(isvc, revision)",
    r'\}-engine"': "names.network_policy_name(isvc) (or disruption_budget_name(isvc, component))",
    r'\}-router"': "names.router_account_name(isvc)",
    r'\}-weights"': "names.cache_pvc_name(isvc)",
    r'\}-prepull-\{\w+\}"': "names.prepull_job_name(isvc, revision)",
    r'"folio-router"': "names.ROUTER_CLUSTER_ROLE",
    r"(?<![\w.])8080\b": "names.ROUTER_PORT",
    r"(?:default|port)=8000\b": "names.ENGINE_PORT",
    r'f"\{DOMAIN\}/\{': "names.override_annotation(name) (or a constant beside it in names.py)",
    r"[\"']folio\.dev/": "names.override_annotation(name) (or a constant beside it in names.py)",
    r"[\"']inference\.networking\.k8s\.io/": "names.INFERENCE_POOL",
    r"[\"']gateway\.networking\.k8s\.io/": "names.HTTP_ROUTE",
    r"[\"']keda\.sh/": "names.SCALED_OBJECT",
}
# Known spellings someone is removing right now: (file under operator/, pattern). Each must still be there
# (a stale entry fails too), so the list empties as they go.
PENDING: set[tuple[str, str]] = set()


def test_engine_objects_and_their_revision_are_inverse() -> None:
    assert engine_name("chat", "3f2a9c01de") == "chat-3f2a9c01de"
    assert revision_of_service("chat", engine_name("chat", "3f2a9c01de")) == "3f2a9c01de"
    assert revision_of_service("chat", "chat-") is None
    assert revision_of_service("chat", "other-3f2a9c01de") is None


def test_labels_select_what_they_label() -> None:
    labels = component_labels("chat", "engine", "r1")
    assert labels["serving.folio.dev/inferenceservice"] == "chat" and labels["serving.folio.dev/revision"] == "r1"
    assert has_labels({"metadata": {"labels": labels}}, selector("chat", "engine", "r1"))
    assert not has_labels({"metadata": {"labels": labels}}, selector("chat", "engine", "r2"))
    assert not has_labels({"metadata": {}}, selector("chat", "router"))


def test_paths_of_core_and_grouped_kinds() -> None:
    assert path("v1", "Pod", "ml") == "/api/v1/namespaces/ml/pods"
    assert path("apps/v1", "Deployment", "ml", "chat") == "/apis/apps/v1/namespaces/ml/deployments/chat"
    assert path("serving.folio.dev/v1alpha1", "InferenceService", "ml") == (
        "/apis/serving.folio.dev/v1alpha1/namespaces/ml/inferenceservices"
    )


def test_the_namespace_is_the_pod_s_then_the_environment_s_then_the_context_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "from-context"}}],
    }))  # fmt: skip
    monkeypatch.setattr(names, "SERVICE_ACCOUNT_DIR", tmp_path / "no-pod")
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    assert names.namespace_in_pod() is None and names.current_namespace() == "default"
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    assert names.current_namespace() == "from-context"
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    assert names.current_namespace() == "from-env"
    (tmp_path / "pod").mkdir()
    (tmp_path / "pod" / "namespace").write_text("from-pod\n")
    monkeypatch.setattr(names, "SERVICE_ACCOUNT_DIR", tmp_path / "pod")
    assert names.namespace_in_pod() == "from-pod" and names.current_namespace() == "from-pod"


def test_names_of_the_optional_and_derived_objects() -> None:
    assert inference_pool_name("chat", "r1") == "chat-r1"  # one pool per revision
    assert endpoint_picker_name("chat", "r1") == "chat-r1-epp"  # the upstream chart's {pool}-epp
    assert http_route_name("chat") == "chat"
    assert network_policy_name("chat") == "chat-engine"
    assert override_annotation("promote") == "folio.dev/promote"
    assert override_annotation("promote@sql") == "folio.dev/promote-adapter"  # its value names the adapter
    assert INFERENCE_POOL == ("inference.networking.k8s.io/v1", "InferencePool")
    assert SCALED_OBJECT == ("keda.sh/v1alpha1", "ScaledObject")
    assert PLURALS[INFERENCE_POOL] == "inferencepools" and INFERENCE_POOL in MANAGED_KINDS
    assert HTTP_ROUTE == ("gateway.networking.k8s.io/v1", "HTTPRoute")
    assert PLURALS[HTTP_ROUTE] == "httproutes" and HTTP_ROUTE in MANAGED_KINDS


def test_no_module_but_names_spells_a_name_port_or_annotation_out() -> None:
    found: list[str] = []
    seen_pending: set[tuple[str, str]] = set()
    for source in sorted(OPERATOR.rglob("*.py")):
        rel = source.relative_to(OPERATOR).as_posix()
        if rel == "k8s/names.py":
            continue
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
            for pattern, instead in SPELLED_OUT.items():
                if re.search(pattern, line):
                    if (rel, pattern) in PENDING:
                        seen_pending.add((rel, pattern))
                        continue
                    found.append(f"operator/{rel}:{number}: {line.strip()}  -> use {instead}")
    assert not found, "spelled out outside operator/k8s/names.py:\n" + "\n".join(found)
    stale = PENDING - seen_pending
    assert not stale, f"no longer spelled out, drop from PENDING: {sorted(stale)}"
