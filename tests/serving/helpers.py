"""Specs, revisions and planned objects for the serving tests."""

from __future__ import annotations

from typing import Any

from folio.operator.serving.objects import Owner, PlanSettings, objects
from folio.operator.serving.plan import Placement, plan
from folio.operator.serving.validate import CLUSTER, Problem, validate
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus, RevisionStatus, revision_name

COMMIT = "0123456789abcdef0123456789abcdef01234567"
DIGEST = "sha256:" + "cd" * 32
OWNER = Owner("chat", "ml", "uid-1")


def make_spec(**overrides: Any) -> InferenceServiceSpec:
    body: dict[str, Any] = {
        "model": {"source": "hf://HuggingFaceTB/SmolLM2-135M-Instruct", "revision": COMMIT, "digest": DIGEST,
                  "credentialsSecretRef": {"name": "hf-token"}},
        "replicas": 3,
        "engine": {
            "image": "registry.example/folio:1",
            "resources": {"limits": {"nvidia.com/gpu": 1}},
            "args": {"maxModelLen": 4096, "enablePrefixCaching": False, "gpuMemoryUtilization": 0.8},
            "nodeSelector": {"gpu": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "priorityClassName": "inference",
            "env": [{"name": "LOG_LEVEL", "value": "debug"}],
        },
        "router": {"replicas": 2},
        "cache": {"size": "50Gi", "storageClassName": "nfs"},
        "overflow": {"url": "https://overflow.example/v1", "apiKeySecretRef": {"name": "overflow-key"}},
    }
    body.update(overrides)
    return InferenceServiceSpec.model_validate(body)


def problems(spec: InferenceServiceSpec) -> list[Problem]:
    """The operator's verdict on a spec of the InferenceService "chat" (empty: it can be planned)."""
    return validate("chat", spec, CLUSTER)


def revision(spec: InferenceServiceSpec, role: str = "Stable", weights_ready: bool = True) -> RevisionStatus:
    return RevisionStatus(name=revision_name(spec), role=role, model=spec.model, image=spec.engine.image,
                          args=dict(spec.engine.args), weights_ready=weights_ready)


def planned(spec: InferenceServiceSpec, *revisions: RevisionStatus) -> list[dict[str, Any]]:
    serving = plan("chat", spec, InferenceServiceStatus(revisions=list(revisions)), Placement.cluster())
    return objects(serving, OWNER, PlanSettings(image="registry.example/folio-operator:1"))


def objects_by_key(spec: InferenceServiceSpec, *revisions: RevisionStatus) -> dict[tuple[str, str], dict[str, Any]]:
    objs = planned(spec, *revisions)
    keyed = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    assert len(keyed) == len(objs), "duplicate objects in the plan"
    return keyed
