"""The serving plan: one answer to "what should run", for the operator's pods and `folio up`'s processes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from folio.operator.serving.errors import PlanningError
from folio.operator.serving.plan import Placement, plan
from folio.operator.spec import InferenceServiceStatus, RevisionStatus, TrafficTarget
from tests.serving.helpers import COMMIT, DIGEST, make_spec, revision


def serve_parser() -> argparse.ArgumentParser:
    from folio.engine import serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    return parser


def test_only_running_revisions_run_and_none_before_its_weights() -> None:
    spec = make_spec()
    stable = revision(spec)
    canary = revision(make_spec(engine={"image": "registry.example/folio:2"}), "Canary", weights_ready=False)
    retiring = revision(make_spec(engine={"image": "registry.example/folio:0"}), "Retiring")
    failed = revision(make_spec(engine={"image": "registry.example/folio:bad"}), "Failed")
    status = InferenceServiceStatus(revisions=[stable, canary, retiring, failed])
    serving = plan("chat", spec, status, Placement.cluster())
    assert [(r.name, r.role, r.replicas, r.pull_weights) for r in serving.revisions] == [
        (stable.name, "Stable", 3, False), (canary.name, "Canary", 0, True), (retiring.name, "Retiring", 3, False),
    ]
    assert serving.revision(failed.name) is None


def test_the_cluster_and_this_machine_run_the_same_command_line_but_for_where() -> None:
    spec = make_spec()
    status = InferenceServiceStatus(revisions=[revision(spec)])
    [pod] = plan("chat", spec, status, Placement.cluster()).revisions
    [local] = plan("chat", spec, status, Placement.this_machine(Path("/state/cache"))).revisions
    pod_args, local_args = pod.serve_args(), local.serve_args(9123)
    assert pod_args == [
        "--model", f"/weights/{pod.name}/SmolLM2-135M-Instruct", "--served-model-name", "chat",
        "--host", "0.0.0.0", "--port", "8000", "--metrics-port", "8001", "--revision", COMMIT, "--digest", DIGEST,
        "--no-enable-prefix-caching", "--gpu-memory-utilization", "0.8", "--max-model-len", "4096",
    ]
    # a `folio up` replica keeps one port: /metrics on its API port, no --metrics-port
    assert "--metrics-port" not in local_args
    shared = [a for i, a in enumerate(pod_args) if a != "--metrics-port" and pod_args[i - 1] != "--metrics-port"]
    where = {"--model": f"/state/cache/{pod.name}/SmolLM2-135M-Instruct", "--host": "127.0.0.1", "--port": "9123"}
    assert local_args == [where.get(shared[i - 1], a) if i else a for i, a in enumerate(shared)]
    for args in (pod_args, local_args):
        serve_parser().parse_args(args)  # exits 2 on a flag `folio serve` does not know
    with pytest.raises(AssertionError):
        local.serve_args()  # a replica of `folio up` always has its own port


def test_every_revision_answers_to_the_spec_s_served_name() -> None:
    """Clients must not notice which revision answers: the name is the spec's, not the revision's."""
    old = revision(make_spec(model={"source": "file:///m", "digest": DIGEST, "servedName": "old-name"}))
    spec = make_spec(model={"source": "file:///m", "digest": DIGEST, "servedName": "chat-model"})
    [rev] = plan("chat", spec, InferenceServiceStatus(revisions=[old]), Placement.cluster()).revisions
    args = rev.serve_args()
    assert args[args.index("--served-model-name") + 1] == "chat-model"
    unnamed = make_spec(model={"source": "file:///m", "digest": DIGEST})
    [rev] = plan("chat", unnamed, InferenceServiceStatus(revisions=[old]), Placement.cluster()).revisions
    assert rev.serve_args()[rev.serve_args().index("--served-model-name") + 1] == "chat"


def test_replicas_follow_the_spec_in_place() -> None:
    spec, scaled = make_spec(), make_spec(replicas=5)
    status = InferenceServiceStatus(revisions=[revision(spec)])
    assert [r.replicas for r in plan("chat", scaled, status, Placement.cluster()).revisions] == [5]


def test_a_running_revision_with_bad_engine_args_is_a_planning_error() -> None:
    spec = make_spec()
    bad = RevisionStatus(name="r1", role="Stable", model=spec.model, image="img", args={"noSuchFlag": 1})
    with pytest.raises(PlanningError, match="unknown engine arg 'noSuchFlag'"):
        plan("chat", spec, InferenceServiceStatus(revisions=[bad]), Placement.cluster())


def test_the_router_config_is_worked_out_on_use() -> None:
    """The operator never needs it (its routers derive it): a config that cannot be used fails only who asks."""
    status = InferenceServiceStatus(stable_revision="r1", traffic=[TrafficTarget(revision="r1", weight=100)])
    serving = plan("chat", make_spec(), status, Placement.cluster(), {"r1": ["10.0.0.1:8000"]})
    with pytest.raises(ValueError, match="must start with http"):
        _ = serving.router
    fine = plan("chat", make_spec(), status, Placement.cluster(), {"r1": ["http://10.0.0.1:8000"]})
    assert fine.router.endpoints == {"r1": ["http://10.0.0.1:8000"]}
