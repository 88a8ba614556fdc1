"""A replica larger than one pod (tensorParallelSize × pipelineParallelSize beyond one pod's GPUs): a
LeaderWorkerSet per revision, checked against LeaderWorkerSet's CRD schema (vendored beside) and its pod
templates against Kubernetes' own; its Service of leaders, its NetworkPolicy, the planning errors."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from folio.operator.serving.plan import Placement, plan
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus, revision_name
from tests.serving.helpers import make_spec, objects_by_key, problems, revision
from tests.serving.test_keda import pruned

CRD = yaml.safe_load((Path(__file__).parent / "vendor" / "leaderworkerset.x-k8s.io_leaderworkersets.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
TP8_PP2 = {"tensorParallelSize": 8, "pipelineParallelSize": 2, "maxModelLen": 8192}
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def _spec(args: dict[str, Any], resources: dict[str, Any] | None = None, **more: Any) -> InferenceServiceSpec:
    engine = make_spec().model_dump(by_alias=True, exclude_none=True)["engine"]
    engine.pop("resources")
    if resources is not None:
        engine["resources"] = resources
    return make_spec(engine=engine | {"args": args}, **more)


def _lws(spec: InferenceServiceSpec, *revisions: Any) -> dict[str, Any]:
    objs = objects_by_key(spec, *(revisions or (revision(spec),)))
    assert ("Deployment", f"chat-{revision_name(spec)}") not in objs, "a LeaderWorkerSet instead"
    return objs[("LeaderWorkerSet", f"chat-{revision_name(spec)}")]


def _valid(lws: dict[str, Any]) -> None:
    """As the API server would take it: LeaderWorkerSet's schema (nothing pruned) and, for the pod templates
    that schema embeds, Kubernetes' own PodTemplate."""
    jsonschema.validate(lws, SCHEMA)
    assert pruned(lws, SCHEMA) == []
    assert lws["apiVersion"] == f"{CRD['spec']['group']}/{CRD['spec']['versions'][0]['name']}"
    assert lws["kind"] == CRD["spec"]["names"]["kind"]
    for which in ("leaderTemplate", "workerTemplate"):
        template = lws["spec"]["leaderWorkerTemplate"][which]
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                      "template": template}, "1.30", strict=True)


def test_a_70b_model_on_two_8_gpu_nodes_is_a_leader_worker_set() -> None:
    spec = _spec(TP8_PP2)
    assert problems(spec) == []
    lws = _lws(spec)
    _valid(lws)
    body = lws["spec"]
    assert body["replicas"] == 3  # groups: spec.replicas
    assert body["startupPolicy"] == "LeaderCreated"  # LeaderReady would wait for a leader that waits for workers
    assert body["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    template = body["leaderWorkerTemplate"]
    assert (template["size"], template["restartPolicy"]) == (2, "RecreateGroupOnPodRestart")
    leader, worker = (template[t]["spec"] for t in ("leaderTemplate", "workerTemplate"))
    (lc,), (wc,) = leader["containers"], worker["containers"]
    for c, pod in ((lc, leader), (wc, worker)):
        assert c["resources"] == {"limits": {"nvidia.com/gpu": "8"}}  # a pipeline stage per pod
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}} in pod["volumes"]
        claim = next(v for v in pod["volumes"] if v["name"] == "weights")
        assert claim["persistentVolumeClaim"] == {"claimName": "chat-weights", "readOnly": True}  # one cache
        assert {"name": "rendezvous", "containerPort": 29500, "protocol": "TCP"} in c["ports"]
        assert {"name": "LOG_LEVEL", "value": "debug"} in c["env"]
        assert not [e for e in c["env"] if e["name"].startswith("LWS_")]  # LeaderWorkerSet sets those
    args = lc["args"]
    for flag, value in (("--tensor-parallel-size", "8"), ("--pipeline-parallel-size", "2"), ("--nnodes", "2"),
                        ("--master-port", "29500"), ("--port", "8000")):
        assert args[args.index(flag) + 1] == value
    # rank and leader address come from LeaderWorkerSet's environment, never the command line
    assert not {"--node-rank", "--master-addr", "--headless"} & set(args)
    assert wc["args"][-1] == "--headless" and "--port" not in wc["args"] and "--host" not in wc["args"]
    assert [a for a in wc["args"] if a != "--headless"] == [a for a in args if a not in {
        "--host", "0.0.0.0", "--port", "8000", "--metrics-port", "8001"}]
    assert {"startupProbe", "readinessProbe", "livenessProbe"} <= set(lc)
    assert not {"startupProbe", "readinessProbe", "livenessProbe", "lifecycle"} & set(wc)
    assert [p["name"] for p in lc["ports"]] == ["http", "metrics", "rendezvous", "steps"]
    assert [p["name"] for p in wc["ports"]] == ["rendezvous", "steps"]
    labels = template["leaderTemplate"]["metadata"]["labels"]
    assert template["workerTemplate"]["metadata"]["labels"] == labels
    assert labels["serving.folio.dev/revision"] == revision_name(spec)


def test_the_engine_service_selects_leaders_only() -> None:
    spec = _spec(TP8_PP2)
    objs = objects_by_key(spec, revision(spec))
    service = objs[("Service", f"chat-{revision_name(spec)}")]
    kubernetes_validate.validate(service, "1.30", strict=True)
    assert service["spec"]["selector"][WORKER_INDEX] == "0"
    single = make_spec()
    assert WORKER_INDEX not in objects_by_key(single, revision(single))[
        ("Service", f"chat-{revision_name(single)}")]["spec"]["selector"]


def test_a_groups_pods_reach_each_other_on_the_rendezvous_and_collective_ports_only() -> None:
    spec = _spec(TP8_PP2)
    rev = revision_name(spec)
    objs = objects_by_key(spec, revision(spec))
    policy = objs[("NetworkPolicy", f"chat-{rev}-group")]
    kubernetes_validate.validate(policy, "1.30", strict=True)
    labels = _lws(spec)["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected.items() <= labels.items() and selected["serving.folio.dev/revision"] == rev
    (rule,) = policy["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": selected}}]  # the same revision's pods only
    assert rule["ports"] == [{"protocol": "TCP", "port": 29500, "endPort": 29501},
                             {"protocol": "TCP", "port": 32768, "endPort": 60999}]
    # the engines' own policy still admits only routers and the operator to the API
    assert objs[("NetworkPolicy", "chat-engine")]["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8000}]
    off = _spec(TP8_PP2, networkPolicy={"enabled": False})
    assert not [k for k in objects_by_key(off, revision(off)) if k[0] == "NetworkPolicy"]


@pytest.mark.parametrize(("args", "gpus", "size", "per_pod"), [
    ({"tensorParallelSize": 8, "pipelineParallelSize": 2}, 16, 1, 16),  # one pod holds every rank
    ({"tensorParallelSize": 4, "pipelineParallelSize": 4}, 8, 2, 8),  # two stages per pod
    ({"tensorParallelSize": 2, "pipelineParallelSize": 4}, 2, 4, 2),
    ({"pipelineParallelSize": 3}, 1, 3, 1),
    ({"tensorParallelSize": 8}, 8, 1, 8),
])  # fmt: skip
def test_pods_per_group_from_the_gpus_per_pod(args: dict[str, int], gpus: int, size: int, per_pod: int) -> None:
    spec = _spec(args, {"limits": {"nvidia.com/gpu": gpus}})
    assert problems(spec) == []
    (rev,) = plan("chat", spec, InferenceServiceStatus(revisions=[revision(spec)]), Placement.cluster()).revisions
    assert rev.group_size == size
    objs = objects_by_key(spec, revision(spec))
    kind = "Deployment" if size == 1 else "LeaderWorkerSet"
    workload = objs[(kind, f"chat-{rev.name}")]
    pod = (workload["spec"]["template"] if size == 1 else workload["spec"]["leaderWorkerTemplate"]["leaderTemplate"])
    shm = next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")["emptyDir"]
    assert shm.get("sizeLimit") == (f"{per_pod}Gi" if per_pod > 1 else None)
    if size > 1:
        _valid(workload)
        assert workload["spec"]["leaderWorkerTemplate"]["size"] == size
    else:
        assert "--nnodes" not in pod["spec"]["containers"][0]["args"]


def test_cpu_ranks_without_a_gpu_count_run_in_one_pod() -> None:
    spec = _spec(TP8_PP2, {"limits": {"cpu": "32"}})
    assert problems(spec) == []
    assert ("Deployment", f"chat-{revision_name(spec)}") in objects_by_key(spec, revision(spec))


@pytest.mark.parametrize(("args", "gpus", "path", "pattern"), [
    ({"tensorParallelSize": 8, "pipelineParallelSize": 3}, 16, "spec.engine.args.pipelineParallelSize",
     r"tensorParallelSize 8 × pipelineParallelSize 3 = 24 ranks is not a multiple of the 16 GPUs per pod"),
    ({"tensorParallelSize": 4, "pipelineParallelSize": 2}, 6, "spec.engine.args.tensorParallelSize",
     r"tensorParallelSize 4 needs a multiple of 4 GPUs per pod .*never spans pods.*nvidia\.com/gpu: 6"),
    ({"tensorParallelSize": 8, "pipelineParallelSize": 2}, 4, "spec.engine.args.tensorParallelSize",
     r"tensorParallelSize 8 needs 8 GPUs .*nvidia\.com/gpu: 4"),
])  # fmt: skip
def test_ranks_that_do_not_divide_over_pods_are_a_planning_error(args: dict[str, int], gpus: int, path: str,
                                                                  pattern: str) -> None:
    (problem,) = problems(_spec(args, {"limits": {"nvidia.com/gpu": gpus}}))
    assert (problem.path, problem.reason) == (path, "InvalidEngineArgs")
    assert re.search(pattern, problem.message), problem.message


@pytest.mark.parametrize("key", ["nnodes", "nodeRank", "masterAddr", "masterPort", "headless"])
def test_the_flags_the_operator_sets_for_a_group_are_refused(key: str) -> None:
    (problem,) = problems(_spec({**TP8_PP2, key: True if key == "headless" else 1}))
    assert (problem.path, problem.reason) == (f"spec.engine.args.{key}", "InvalidEngineArgs")
    assert "set by the operator for a replica that spans several pods" in problem.message


def test_a_name_too_long_for_a_leader_worker_sets_pods_is_refused() -> None:
    spec = _spec(TP8_PP2)
    from folio.operator.serving.validate import CLUSTER, validate

    assert validate("c" * 37, spec, CLUSTER) == []
    (problem,) = validate("c" * 38, spec, CLUSTER)
    assert (problem.path, problem.reason) == ("metadata.name", "InvalidName")
    assert "at most 37" in problem.message
    assert validate("c" * 44, make_spec(), CLUSTER) == []  # a one-pod replica keeps the usual limit


def test_a_canary_is_a_leader_worker_set_of_its_own_and_keda_scales_groups() -> None:
    prometheus = {"analysis": {"prometheus": {"url": "http://prometheus:9090"}}}
    stable = _spec(TP8_PP2, rollout=prometheus)
    canary = _spec({**TP8_PP2, "maxModelLen": 4096}, rollout=prometheus,
                   autoscaling={"minReplicas": 0, "maxReplicas": 4, "metric": "Waiting", "target": 2, "keda": True})
    objs = objects_by_key(canary, revision(stable), revision(canary, "Canary"))
    mine = {name for kind, name in objs if kind == "LeaderWorkerSet"}
    assert mine == {f"chat-{revision_name(stable)}", f"chat-{revision_name(canary)}"}
    for name in mine:
        lws = objs[("LeaderWorkerSet", name)]
        _valid(lws)
        assert "replicas" not in lws["spec"], "KEDA owns the count of groups"
        scaled = objs[("ScaledObject", name)]["spec"]["scaleTargetRef"]
        assert scaled == {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": name}


def test_the_docs_example_plans_as_the_docs_say() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "tensor-parallelism.md").read_text()
    block = text.split("<!-- lws-example -->", 1)[1].split("```yaml", 1)[1].split("```", 1)[0]
    manifest = yaml.safe_load(block)
    from folio.operator.serving.validate import CLUSTER, validate

    spec = InferenceServiceSpec.model_validate(manifest["spec"])
    assert validate(manifest["metadata"]["name"], spec, CLUSTER) == []
    serving = plan("llama-70b", spec, InferenceServiceStatus(revisions=[revision(spec)]), Placement.cluster())
    (rev,) = serving.revisions
    assert (rev.group_size, rev.replicas) == (2, 2)
    args = rev.serve_args()
    assert " ".join(args).endswith("--tensor-parallel-size 8 --nnodes 2 --master-port 29500")
    assert "--pipeline-parallel-size 2" in " ".join(args) and "--dtype bfloat16" in " ".join(args)


def test_pipeline_parallel_size_is_checked_like_any_engine_arg() -> None:
    (problem,) = problems(_spec({"pipelineParallelSize": 0}))
    assert (problem.path, problem.reason) == ("spec.engine.args.pipelineParallelSize", "InvalidEngineArgs")
    (problem,) = problems(_spec({"pipelineParallelSize": "2"}))
    assert "must be an integer" in problem.message


def test_the_pre_pull_checks_the_weights_against_the_ranks() -> None:
    """Whether the model's layers and heads split as asked is known once its weights are in: the pre-pull Job
    checks, so that a revision that could never start fails its WeightsReady, in status, instead of its groups
    failing each start (tests/test_prepull.py: the check itself)."""
    spec = _spec(TP8_PP2)
    objs = objects_by_key(spec, revision(spec, weights_ready=False))
    [container] = objs[("Job", f"chat-prepull-{revision_name(spec)}")]["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    assert args[args.index("--pipeline-parallel-size") + 1] == "2"
    plain = make_spec()
    [container] = objects_by_key(plain, revision(plain, weights_ready=False))[
        ("Job", f"chat-prepull-{revision_name(plain)}")]["spec"]["template"]["spec"]["containers"]
    assert "--pipeline-parallel-size" not in container["args"]
