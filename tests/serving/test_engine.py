"""The engine command line: `spec.engine.args` as `folio serve` flags, and what the operator sets."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from folio.operator.serving.engine import camel, engine_flags, engine_flags_table, flags_of, kebab
from folio.operator.serving.errors import PlanningError
from folio.operator.spec import revision_name
from tests.serving.helpers import DIGEST, make_spec, objects_by_key, problems, revision


def test_engine_args_become_kebab_case_flags() -> None:
    assert kebab("maxModelLen") == "max-model-len" and camel("max-model-len") == "maxModelLen"
    assert kebab("gpuMemoryUtilization") == "gpu-memory-utilization"
    assert kebab("faultLatencyMs") == "fault-latency-ms"
    parser = argparse.ArgumentParser()
    parser.add_argument("--model")
    parser.add_argument("--max-num-seqs", type=int)
    parser.add_argument("--dtype", choices=["auto", "bfloat16"])
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
    parser.add_argument("--enforce-eager", action="store_true")
    table = flags_of(parser)
    assert set(table) == {"maxNumSeqs", "dtype", "enablePrefixCaching", "enforceEager"}  # not --model
    args = {"maxNumSeqs": 8, "enablePrefixCaching": False, "dtype": "bfloat16", "enforceEager": True}
    assert engine_flags(args, table) == [
        "--dtype", "bfloat16", "--no-enable-prefix-caching", "--enforce-eager", "--max-num-seqs", "8",
    ]
    assert engine_flags({"enforceEager": False}, table) == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"maxModelLenght": 4096}, "unknown engine arg 'maxModelLenght' (known args: "),
        ({"maxModelLen": "4k"}, "'maxModelLen' must be an integer"),
        ({"maxModelLen": True}, "'maxModelLen' must be an integer"),
        ({"enablePrefixCaching": "yes"}, "must be true or false"),
        ({"dtype": "fp8"}, "'dtype' must be one of auto, float32, bfloat16, float16, got 'fp8'"),
        ({"model": "/elsewhere"}, "set by the operator"),
        ({"port": 9000}, "set by the operator"),
    ],
)
def test_bad_engine_args_are_planning_errors(args: dict[str, Any], fragment: str) -> None:
    (problem,) = problems(make_spec(engine={"args": args}))
    assert (problem.path, problem.reason) == (f"spec.engine.args.{next(iter(args))}", "InvalidEngineArgs")
    assert fragment in problem.message
    with pytest.raises(PlanningError, match="known args: "):  # the planner refuses them too
        engine_flags(args)


def test_each_bad_engine_arg_is_a_problem_of_its_own() -> None:
    found = problems(make_spec(engine={"args": {"bogus": 1, "maxModelLen": "4k", "maxNumSeqs": 8}}))
    assert [p.path for p in found] == ["spec.engine.args.bogus", "spec.engine.args.maxModelLen"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [  # values of the right type that `folio serve` itself refuses: they used to crash-loop the pods
        ({"maxNumSeqs": 0}, "spec.engine.args.maxNumSeqs: max_num_seqs must be >= 1, got 0"),
        ({"maxNumSeqs": -5}, "spec.engine.args.maxNumSeqs"),
        ({"blockSize": 0}, "spec.engine.args.blockSize: block_size must be a power of two"),
        ({"maxModelLen": 10**12}, "spec.engine.args.maxModelLen: max_model_len must be in [1, 33554432]"),
        ({"kvCacheMemoryGib": -1}, "spec.engine.args.kvCacheMemoryGib: kv_cache_memory_gib must be > 0"),
        ({"shutdownTimeout": -1}, "spec.engine.args.shutdownTimeout: --shutdown-timeout must be >= 0"),
        ({"maxN": 0}, "spec.engine.args.maxN: --max-n must be >= 1"),
        ({"faultErrorRate": 1.5}, "spec.engine.args.faultErrorRate: fault error rate must be in [0, 1]"),
    ],
)
def test_engine_arg_values_folio_serve_refuses_are_planning_errors(args: dict[str, Any], fragment: str) -> None:
    (problem,) = problems(make_spec(engine={"args": args}))
    assert problem.reason == "InvalidEngineArgs"
    assert problem.path == f"spec.engine.args.{next(iter(args))}"
    assert fragment in str(problem)


@pytest.mark.parametrize("source", ["pvc://just-a-claim", "pvc://claim/"])
def test_a_source_without_a_path_is_a_planning_error(source: str) -> None:
    (problem,) = problems(make_spec(model={"source": source, "digest": DIGEST}))
    assert (problem.path, problem.reason) == ("spec.model.source", "InvalidModelSource")
    assert "pvc://CLAIM/PATH" in problem.message


def test_every_engine_arg_renders_to_a_command_line_folio_serve_accepts() -> None:
    from folio.engine import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    table = engine_flags_table()
    assert {"maxModelLen", "blockSize", "enablePrefixCaching", "faultErrorRate", "faultLatencyMs"} <= set(table)
    ngram = {"method": "ngram", "num_speculative_tokens": 2}
    sample = {"int": 16, "float": 0.5, "bool": False, "switch": True, "str": "x", "json": ngram}
    for key, flag in table.items():
        value = flag.choices[0] if flag.choices else sample[flag.kind]
        parsed = parser.parse_args(["--model", "/m", *engine_flags({key: value})])  # exits 2 on a bad flag
        got = getattr(parsed, kebab(key).replace("-", "_"))
        assert (json.loads(got) if flag.kind == "json" else got) == value
    # The whole engine command line of a planned pod parses too.
    spec = make_spec()
    container = objects_by_key(spec, revision(spec))[("Deployment", f"chat-{revision_name(spec)}")]
    parser.parse_args(container["spec"]["template"]["spec"]["containers"][0]["args"])
