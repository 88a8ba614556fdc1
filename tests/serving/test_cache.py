"""The weights cache in a cluster: its PVC and the pre-pull Job, valid for Kubernetes and agreeing with prepull."""

from __future__ import annotations

import kubernetes_validate
import pytest

from folio.operator.prepull import model_dir_name, weights_path
from folio.operator.serving.cache import prepull_job, weights_pvc
from folio.operator.spec import CacheSpec, ModelSource

SHA = "0123456789abcdef0123456789abcdef01234567"
KUBE = ["1.30.0", kubernetes_validate.latest_version()]

OWNER = {"apiVersion": "serving.folio.dev/v1alpha1", "kind": "InferenceService", "name": "chat",
         "uid": "u-1", "controller": True, "blockOwnerDeletion": True}


@pytest.mark.parametrize("version", KUBE)
def test_job_for_an_hf_revision(version: str) -> None:
    model = ModelSource.model_validate(
        {"source": "hf://Org/Tiny", "revision": SHA, "credentialsSecretRef": {"name": "hf-token"}}
    )
    job = prepull_job("chat", "ns", "3f2a9c01de", model, image="img:1", owner=OWNER)
    kubernetes_validate.validate(job, version, strict=True)
    assert job["metadata"]["name"] == "chat-prepull-3f2a9c01de"
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "prepull"
    assert job["metadata"]["labels"]["serving.folio.dev/revision"] == "3f2a9c01de"
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["args"] == ["--source", "hf://Org/Tiny", "--dest", "/weights/3f2a9c01de/Tiny", "--revision", SHA]
    token = next(e for e in container["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert pod["volumes"] == [{"name": "weights", "persistentVolumeClaim": {"claimName": "chat-weights"}},
                              {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]  # the root filesystem is read-only
    assert weights_path("3f2a9c01de", model) == "/weights/3f2a9c01de/Tiny"


@pytest.mark.parametrize("version", KUBE)
def test_job_for_a_pvc_revision_mounts_the_source_read_only(version: str) -> None:
    model = ModelSource(source="pvc://models/llama/8b", digest="sha256:" + "a" * 64)
    job = prepull_job("chat", "ns", "r2", model, image="img:1")
    kubernetes_validate.validate(job, version, strict=True)
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["args"][:4] == ["--source", "pvc://models/llama/8b", "--dest", "/weights/r2/8b"]
    assert {"name": "source", "mountPath": "/source/models", "readOnly": True} in container["volumeMounts"]
    assert "HF_TOKEN" not in str(container["env"])
    assert model_dir_name(model) == "8b"


@pytest.mark.parametrize("version", KUBE)
def test_cache_pvc(version: str) -> None:
    pvc = weights_pvc("chat", "ns", CacheSpec(size="40Gi", storageClassName="fast"), owner=OWNER)
    kubernetes_validate.validate(pvc, version, strict=True)
    assert pvc["metadata"]["name"] == "chat-weights"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "40Gi"
    assert pvc["spec"]["storageClassName"] == "fast"
