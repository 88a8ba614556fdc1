"""Speculative decoding's draft model through the operator (`spec.draftModel`): pinned in the revision,
pre-pulled by the revision's Job beside its weights, named to the engines in ``--speculative-config``;
what disagrees is a problem in status, never a pod that cannot start."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest

from folio.operator.serving.validate import INVALID_ENGINE_ARGS, INVALID_MODEL_SOURCE, INVALID_SPEC
from folio.operator.spec import InferenceServiceSpec, new_revision, revision_name
from tests.serving.helpers import COMMIT, DIGEST, make_spec, objects_by_key, problems

DRAFT = {"source": "hf://HuggingFaceTB/SmolLM2-135M-draft", "revision": "f" * 40,
         "credentialsSecretRef": {"name": "draft-token", "key": "hf"}}  # fmt: skip
SPECULATE = {"num_speculative_tokens": 4}


def with_draft(draft: dict[str, Any] | None = DRAFT, config: Any = SPECULATE) -> InferenceServiceSpec:
    spec = make_spec().model_dump(by_alias=True, exclude_none=True)
    if config is not None:
        spec["engine"]["args"]["speculativeConfig"] = config
    if draft is not None:
        spec["draftModel"] = draft
    return InferenceServiceSpec.model_validate(spec)


def found(spec: InferenceServiceSpec) -> list[tuple[str, str, str]]:
    return [(p.path, p.reason, p.message) for p in problems(spec)]


def test_a_draft_model_with_its_config_plans_a_pull_and_the_engines_flag() -> None:
    spec = with_draft()
    assert problems(spec) == []
    rev = revision_name(spec)
    status = new_revision(spec, "Stable", "2026-12-07T00:00:00Z")
    assert status.draft_model is not None and status.draft_model.revision == "f" * 40
    pulling = objects_by_key(spec, status)
    job = pulling[("Job", f"chat-prepull-{rev}")]
    kubernetes_validate.validate(job, "1.30", strict=True)
    [container] = job["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    draft_dest = f"/weights/{rev}-draft/SmolLM2-135M-draft"
    assert args[args.index("--draft-source") + 1] == DRAFT["source"]
    assert args[args.index("--draft-dest") + 1] == draft_dest
    assert args[args.index("--draft-revision") + 1] == "f" * 40
    assert "--draft-digest" not in args  # hf:// without a pinned digest: the Job records what it fetched
    assert args[args.index("--max-model-len") + 1] == "4096"  # the spec's maxModelLen: the draft must read as far
    tokens = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
    assert tokens == {"HF_TOKEN": {"name": "hf-token", "key": "token"},
                      "FOLIO_DRAFT_HF_TOKEN": {"name": "draft-token", "key": "hf"}}  # each its own
    # once verified, the engines are told where the pre-pull put the draft
    serving = objects_by_key(spec, status.model_copy(update={"weights_ready": True}))
    [engine] = serving[("Deployment", f"chat-{rev}")]["spec"]["template"]["spec"]["containers"]
    flag = engine["args"][engine["args"].index("--speculative-config") + 1]
    assert json.loads(flag) == {"model": draft_dest, "num_speculative_tokens": 4}


def test_the_draft_is_part_of_the_revision_and_a_spec_without_one_keeps_its_name() -> None:
    plain, drafted = make_spec(), with_draft()
    assert revision_name(with_draft(draft=None, config=None)) == revision_name(plain)
    assert revision_name(drafted) != revision_name(with_draft(draft=None))  # a draft is a new revision ...
    other = with_draft(draft={**DRAFT, "revision": "e" * 40})
    assert revision_name(other) != revision_name(drafted)  # ... and so is another pin of it
    assert new_revision(plain, "Stable", "2026-12-07T00:00:00Z").draft_model is None


def test_pvc_sources_of_model_and_draft_each_mount_their_claim_once() -> None:
    spec = with_draft(draft={"source": "pvc://drafts/smol/135m", "digest": DIGEST}).model_copy(
        update={"model": make_spec().model.model_copy(update={"source": "pvc://models/smol/1b", "revision": None,
                                                              "credentials_secret_ref": None})})  # fmt: skip
    assert problems(spec) == []
    job = objects_by_key(spec, new_revision(spec, "Stable", "2026-12-07T00:00:00Z"))[("Job", f"chat-prepull-{revision_name(spec)}")]
    kubernetes_validate.validate(job, "1.30", strict=True)
    [container] = job["spec"]["template"]["spec"]["containers"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/source/models", "/source/drafts"} <= mounts
    claims = [v["persistentVolumeClaim"]["claimName"] for v in job["spec"]["template"]["spec"]["volumes"]
              if "persistentVolumeClaim" in v]  # fmt: skip
    assert sorted(claims) == ["chat-weights", "drafts", "models"]
    assert "HF_TOKEN" not in json.dumps(container["env"])


@pytest.mark.parametrize(
    ("draft", "config", "path", "reason", "says"),
    [
        (DRAFT, None, "spec.draftModel", INVALID_SPEC, "speculates only with spec.engine.args.speculativeConfig"),
        (DRAFT, {**SPECULATE, "model": "/models/d"}, "spec.engine.args.speculativeConfig", INVALID_ENGINE_ARGS,
         "leaves 'model' out"),
        (DRAFT, {**SPECULATE, "method": "ngram"}, "spec.engine.args.speculativeConfig", INVALID_ENGINE_ARGS,
         "method 'ngram' takes no draft model"),
        (None, {**SPECULATE, "model": "/models/d"}, "spec.engine.args.speculativeConfig", INVALID_ENGINE_ARGS,
         "which nothing pins or pre-pulls"),
        (None, SPECULATE, "spec.engine.args.speculativeConfig", INVALID_ENGINE_ARGS, "or a draft model, pinned in spec.draftModel"),
        (DRAFT, {"num_speculative_tokens": 40}, "spec.engine.args.speculativeConfig", INVALID_ENGINE_ARGS,
         "num_speculative_tokens must be an integer from 1 to 16"),
        ({"source": "pvc://no-path", "digest": DIGEST}, SPECULATE, "spec.draftModel.source", INVALID_MODEL_SOURCE,
         "pvc://CLAIM/PATH"),
    ],
)
def test_a_draft_and_a_config_that_disagree_are_problems_naming_the_field(draft, config, path, reason, says) -> None:
    [(where, why, message)] = found(with_draft(draft=draft, config=config))
    assert (where, why) == (path, reason) and says in message, message


def test_a_draft_is_pinned_like_the_model() -> None:
    with pytest.raises(ValueError, match=r"draftModel\.revision to a full 40-character"):
        with_draft(draft={"source": "hf://Org/draft", "revision": "main"})
    with pytest.raises(ValueError, match=r"need draftModel\.digest"):
        with_draft(draft={"source": "file:///models/draft"})
    assert with_draft(draft={"source": "hf://Org/draft", "revision": COMMIT}).draft_model is not None
