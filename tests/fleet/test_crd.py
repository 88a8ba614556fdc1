"""The RolloutPolicy CRD: committed copy, a valid Kubernetes object, and what its schema accepts and refuses."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pydantic
import pytest
import yaml

from folio.operator.crd import build_policy_crd, render
from folio.operator.fleet.model import RolloutPolicySpec

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "crds" / "serving.folio.dev_rolloutpolicies.yaml"

EXAMPLE = {
    "apiVersion": "serving.folio.dev/v1alpha1", "kind": "RolloutPolicy", "metadata": {"name": "fleet"},
    "spec": {"selector": {"matchLabels": {"tier": "prod"}}, "maxConcurrent": 5,
             "waves": [{"label": "0", "soak": "10m"}, {"label": "1", "soak": "10m"}], "failureBudget": 2},
    "status": {"phase": "Halted", "wave": "1", "running": ["a"], "pending": ["b"], "promoted": ["c"],
               "rolledBack": [{"name": "d", "revision": "r2", "reason": "AnalysisFailed"}],
               "conditions": [{"type": "Ready", "status": "True"}, {"type": "Halted", "status": "True"}]},
}  # fmt: skip


def schema() -> dict[str, Any]:
    return build_policy_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_matches_the_model(folio_bin: str) -> None:
    assert COMMITTED.read_text() == render("RolloutPolicy"), "crds/ is stale: run `make crd`"
    out = subprocess.run([folio_bin, "crd", "--kind", "RolloutPolicy"], capture_output=True, text=True, check=True)
    assert out.stdout == render("RolloutPolicy")
    kubernetes_validate.validate(yaml.safe_load(COMMITTED.read_text()), "1.30", strict=True)


def test_the_issue_example_is_accepted_by_both() -> None:
    jsonschema.Draft4Validator(schema()).validate(EXAMPLE)
    RolloutPolicySpec.model_validate(EXAMPLE["spec"])


@pytest.mark.parametrize("bad", [{"maxConcurrent": 0}, {"failureBudget": 0}, {"waves": [{"label": "0", "soak": "x"}]},
                                 {"selector": {"matchExpressions": [{"key": "a", "operator": "Maybe"}]}}])
def test_what_both_refuse(bad: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema()).validate({**EXAMPLE, "spec": {**EXAMPLE["spec"], **bad}})
    with pytest.raises(pydantic.ValidationError):
        RolloutPolicySpec.model_validate({**EXAMPLE["spec"], **bad})


def test_two_waves_with_one_label_are_refused() -> None:
    waves = schema()["properties"]["spec"]["properties"]["waves"]
    assert waves["x-kubernetes-list-map-keys"] == ["label"]
    with pytest.raises(pydantic.ValidationError, match="given twice"):
        RolloutPolicySpec.model_validate({"waves": [{"label": "0"}, {"label": "0"}]})
