"""The objects e2e/ applies are valid before any cluster sees them (the e2e run itself needs kind)."""

from __future__ import annotations

import jsonschema
import kubernetes_validate
import yaml

from e2e import conftest as e2e
from folio.operator.k8s.names import cache_pvc_name
from folio.operator.serving.engine import engine_flags
from folio.operator.spec import InferenceServiceSpec, revision_name
from tests.chart import helm as h

MODEL = {"source": "pvc://models/SmolLM2-135M-Instruct.Q4_1.gguf", "digest": "sha256:" + "0" * 64,
         "servedName": e2e.SERVED}
CRD = yaml.safe_load((h.REPO / "crds" / "serving.folio.dev_inferenceservices.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_inference_services_are_valid_and_distinct_revisions() -> None:
    manifests = [e2e.inference_service(MODEL), e2e.inference_service(MODEL, faultErrorRate=1.0),
                 e2e.inference_service(MODEL, maxNumSeqs=16)]
    revisions = set()
    for manifest in manifests:
        jsonschema.Draft4Validator(SCHEMA).validate(manifest)  # OpenAPI v3.0 keywords are draft 4's
        spec = InferenceServiceSpec.model_validate(manifest["spec"])
        engine_flags(spec.engine.args)  # plannable: no unknown engine arg
        assert "nvidia.com/gpu" not in spec.engine.resources.limits  # kind nodes have no GPU
        revisions.add(revision_name(spec))
    assert len(revisions) == 3


def test_storage_binds_the_claims_the_tests_and_the_operator_make() -> None:
    objects = e2e._storage("node-1")
    for obj in objects:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    claims = {o["spec"]["claimRef"]["name"]: o for o in objects if o["kind"] == "PersistentVolume"}
    assert set(claims) == {"models", cache_pvc_name(e2e.ISVC)}
    # the operator's cache claim asks for ReadWriteMany and the service's cache size
    cache = claims[cache_pvc_name(e2e.ISVC)]["spec"]
    assert "ReadWriteMany" in cache["accessModes"]
    assert cache["capacity"]["storage"] == e2e.inference_service(MODEL)["spec"]["cache"]["size"]
    assert all(o["spec"]["storageClassName"] == e2e.STORAGE_CLASS for o in claims.values())
