"""Names Folio gives in a cluster, the namespace it acts in, and the client's paths."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from folio.operator.k8s import names
from folio.operator.k8s.client import path
from folio.operator.k8s.names import (
    component_labels,
    engine_name,
    has_labels,
    revision_of_service,
    selector,
)


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
