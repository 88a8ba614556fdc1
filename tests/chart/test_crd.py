"""The chart ships the generated CRD unchanged, and keeps it on uninstall."""

from __future__ import annotations

import pytest
import yaml

from tests.chart import helm as h

GENERATED = h.REPO / "crds" / "serving.folio.dev_inferenceservices.yaml"
CHART_COPY = h.CHART / "files" / "crd.yaml"


def _crd(objects: list[h.Obj]) -> h.Obj:
    return h.one(objects, "CustomResourceDefinition", "inferenceservices.serving.folio.dev")


def test_chart_copy_is_the_generated_crd() -> None:
    if not GENERATED.exists():
        pytest.skip("crds/ has no generated CRD yet (`make crd`)")
    assert CHART_COPY.read_text() == GENERATED.read_text(), "stale chart CRD: run `make crd`"


def test_rendered_crd_equals_the_generated_one(rendered: dict[str, list[h.Obj]]) -> None:
    """Helm's fromYaml/toYaml round trip must not change a single schema field."""
    source = yaml.safe_load(CHART_COPY.read_text())
    crd = _crd(rendered["defaults"])
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["name"] == source["metadata"]["name"]
    assert (crd["apiVersion"], crd["kind"]) == (source["apiVersion"], source["kind"])


def test_crd_is_kept_on_uninstall_and_labelled(rendered: dict[str, list[h.Obj]]) -> None:
    crd = _crd(rendered["defaults"])
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # Argo CD renders the chart and applies it itself, ignoring Helm's policy: the same promise for it
    assert crd["metadata"]["annotations"]["argocd.argoproj.io/sync-options"] == "Prune=false,Delete=false"
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert "namespace" not in crd["metadata"]


POLICY_GENERATED = h.REPO / "crds" / "serving.folio.dev_rolloutpolicies.yaml"
POLICY_COPY = h.CHART / "files" / "crd-rolloutpolicies.yaml"


def test_the_rollout_policy_crd_is_shipped_too(rendered: dict[str, list[h.Obj]]) -> None:
    assert POLICY_COPY.read_text() == POLICY_GENERATED.read_text(), "stale chart CRD: run `make crd`"
    source = yaml.safe_load(POLICY_COPY.read_text())
    crd = h.one(rendered["defaults"], "CustomResourceDefinition", "rolloutpolicies.serving.folio.dev")
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    crds = h.find(rendered["bring-your-own"], "CustomResourceDefinition")
    assert "rolloutpolicies.serving.folio.dev" not in {c["metadata"]["name"] for c in crds}


def test_crd_can_be_left_to_someone_else(rendered: dict[str, list[h.Obj]]) -> None:
    crds = h.find(rendered["bring-your-own"], "CustomResourceDefinition")
    assert "inferenceservices.serving.folio.dev" not in {c["metadata"]["name"] for c in crds}
