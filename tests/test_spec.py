"""The InferenceService model: defaults, pinning rules and revision identity."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from folio.operator.spec import (
    InferenceService,
    InferenceServiceSpec,
    check_name,
    parse_duration,
    revision_name,
)

SHA = "0123456789abcdef0123456789abcdef01234567"
DIGEST = "sha256:" + "ab" * 32


def _spec(**overrides: object) -> InferenceServiceSpec:
    data: dict = {"model": {"source": "hf://HuggingFaceTB/SmolLM2-135M-Instruct", "revision": SHA}}
    data.update(overrides)
    return InferenceServiceSpec.model_validate(data)


def test_defaults_round_trip_in_camel_case() -> None:
    spec = _spec()
    wire = spec.to_wire()
    assert wire["replicas"] == 1
    assert wire["rollout"]["analysis"]["maxErrorRate"] == 0.01
    assert [s["weight"] for s in wire["rollout"]["steps"]] == [5, 25, 50]
    assert wire["engine"]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert InferenceServiceSpec.model_validate(wire) == spec


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"source": "hf://org/m", "revision": "main"}, "40-character"),
        ({"source": "hf://org/m"}, "40-character"),
        ({"source": "hf://org/m", "revision": SHA.upper()}, "40-character"),
        ({"source": "pvc://claim/path"}, "need model.digest"),
        ({"source": "file:///models/x"}, "need model.digest"),
        ({"source": "s3://bucket/x", "digest": DIGEST}, "pattern"),
        ({"source": "file:///x", "digest": "sha256:abc"}, "pattern"),
    ],
)
def test_unpinned_models_are_refused(model: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        InferenceServiceSpec.model_validate({"model": model})


def test_pinned_sources_are_accepted() -> None:
    assert _spec(model={"source": "pvc://weights/smollm2", "digest": DIGEST}).model.scheme == "pvc"
    assert _spec(model={"source": "file:///tmp/m.gguf", "digest": DIGEST}).model.digest == DIGEST


@pytest.mark.parametrize("weights", [[5, 5], [50, 25], [0, 10], [10, 100]])
def test_step_weights_must_strictly_increase_within_1_99(weights: list[int]) -> None:
    with pytest.raises(ValidationError):
        _spec(rollout={"steps": [{"weight": w, "pause": "1s"} for w in weights]})


def test_negative_replicas_and_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError):
        _spec(replicas=-1)
    with pytest.raises(ValidationError, match="replica"):
        _spec(replica=2)


def test_durations() -> None:
    assert parse_duration("30s") == 30
    assert parse_duration("1h30m") == 5400
    assert parse_duration("500ms") == 0.5
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration("5 minutes")
    with pytest.raises(ValidationError):
        _spec(rollout={"analysis": {"interval": "soon"}})


def test_revision_identity_ignores_replicas_and_rollout() -> None:
    base = _spec()
    assert revision_name(base) == revision_name(_spec(replicas=5, rollout={"steps": [{"weight": 50}]}))
    assert revision_name(base) != revision_name(_spec(engine={"args": {"maxModelLen": 1024}}))
    assert revision_name(base) != revision_name(_spec(engine={"image": "other:1"}))
    other_sha = _spec(model={"source": "hf://HuggingFaceTB/SmolLM2-135M-Instruct", "revision": "f" * 40})
    assert revision_name(base) != revision_name(other_sha)
    assert len(revision_name(base)) == 10


def test_whole_object_parses_from_yaml() -> None:
    import yaml

    doc = yaml.safe_load(
        f"""
apiVersion: serving.folio.dev/v1alpha1
kind: InferenceService
metadata: {{name: chat}}
spec:
  model: {{source: "hf://HuggingFaceTB/SmolLM2-135M-Instruct", revision: "{SHA}", servedName: smollm2}}
  replicas: 2
  engine: {{args: {{maxModelLen: 4096, enablePrefixCaching: true}}}}
"""
    )
    isvc = InferenceService.model_validate(doc)
    assert isvc.name == "chat"
    assert isvc.spec.model.served_name == "smollm2"
    assert isvc.spec.engine.args == {"maxModelLen": 4096, "enablePrefixCaching": True}


@pytest.mark.parametrize("url", ["ftp://x", "x", "api.example.com/v1", "https://", "http:// x", "https://u:p@host/v1"])
def test_overflow_and_prometheus_urls_must_be_http_with_a_host(url: str) -> None:
    for part in ({"overflow": {"url": url}}, {"rollout": {"analysis": {"prometheus": {"url": url}}}}):
        with pytest.raises(ValidationError, match="should match pattern"):
            InferenceServiceSpec.model_validate({"model": {"source": "file:///m", "digest": DIGEST}, **part})


@pytest.mark.parametrize("url", ["http://fallback", "https://api.example.com/v1", "http://10.0.0.1:8000", "http://[::1]:9/"])
def test_http_urls_with_a_host_are_accepted(url: str) -> None:
    spec = InferenceServiceSpec.model_validate({"model": {"source": "file:///m", "digest": DIGEST}, "overflow": {"url": url}})
    assert spec.overflow is not None and spec.overflow.url == url


@pytest.mark.parametrize("name", ["Bad_Name!", "../../etc", "a" * 45, "-lead", "trail-", "", "UPPER"])
def test_names_folio_cannot_derive_children_from_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match=r"metadata\.name"):
        check_name(name)


def test_names_up_to_the_limit_are_accepted() -> None:
    assert check_name("a" * 44) == "a" * 44
    assert check_name("chat-2") == "chat-2"


def test_router_load_balancing_defaults_and_bounds() -> None:
    from folio.operator.spec import RouterSpec

    lb = RouterSpec().load_balancing
    assert (lb.strategy, lb.prefix_char_length, lb.mean_load_factor) == ("PrefixHash", 100, 1.25)
    assert RouterSpec().inference_pool is None  # the operator's default decides
    for bad in ({"strategy": "Random"}, {"prefixCharLength": 0}, {"meanLoadFactor": 0.9}):
        with pytest.raises(ValidationError):
            RouterSpec.model_validate({"loadBalancing": bad})


def test_router_migration_defaults_and_bounds() -> None:
    from folio.operator.spec import RouterSpec

    migration = RouterSpec().migration
    assert (migration.max_attempts, migration.inter_chunk_timeout_seconds) == (3, 30.0)
    on = RouterSpec.model_validate({"migration": {"maxAttempts": 0, "interChunkTimeout": "250ms"}}).migration
    assert (on.max_attempts, on.inter_chunk_timeout_seconds) == (0, 0.25)
    for bad in ({"maxAttempts": -1}, {"maxAttempts": 11}, {"interChunkTimeout": "0s"}, {"interChunkTimeout": "soon"},
                {"attempts": 2}):
        with pytest.raises(ValidationError):
            RouterSpec.model_validate({"migration": bad})
