"""A tensor-parallel engine's pod: N GPUs unless resources say otherwise, /dev/shm sized for NCCL, the
flag on its command line; too few explicit GPUs is a planning error."""

from __future__ import annotations

import re
from typing import Any

from folio.operator.spec import InferenceServiceSpec, revision_name
from tests.serving.helpers import make_spec, objects_by_key, problems, revision


def _engine(**engine: Any) -> InferenceServiceSpec:
    base = make_spec().model_dump(by_alias=True, exclude_none=True)["engine"]
    base.pop("resources")
    return make_spec(engine=base | engine)


def _pod(spec: InferenceServiceSpec) -> dict[str, Any]:
    dep = objects_by_key(spec, revision(spec))[("Deployment", f"chat-{revision_name(spec)}")]
    return dep["spec"]["template"]["spec"]


def test_tensor_parallel_engine_asks_for_one_gpu_per_rank_and_shm_for_nccl() -> None:
    spec = _engine(args={"tensorParallelSize": 4, "maxModelLen": 4096})
    assert problems(spec) == []
    pod = _pod(spec)
    (c,) = pod["containers"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "4"}}
    assert c["args"][-4:] == ["--max-model-len", "4096", "--tensor-parallel-size", "4"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_explicit_resources_win() -> None:
    spec = _engine(args={"tensorParallelSize": 2}, resources={"limits": {"nvidia.com/gpu": 8, "memory": "64Gi"}})
    assert problems(spec) == []
    assert _pod(spec)["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "8", "memory": "64Gi"}}
    cpu_only = _engine(args={"tensorParallelSize": 2}, resources={"limits": {"cpu": "8"}})
    assert problems(cpu_only) == []  # CPU ranks: no GPU asked for
    assert _pod(cpu_only)["containers"][0]["resources"] == {"limits": {"cpu": "8"}}


def test_fewer_explicit_gpus_than_ranks_is_a_planning_error() -> None:
    spec = _engine(args={"tensorParallelSize": 4}, resources={"limits": {"nvidia.com/gpu": 2}})
    (problem,) = problems(spec)
    assert (problem.path, problem.reason) == ("spec.engine.args.tensorParallelSize", "InvalidEngineArgs")
    assert re.search(r"tensorParallelSize 4 needs 4 GPUs.*nvidia\.com/gpu: 2", problem.message)
    (problem,) = problems(_engine(args={"tensorParallelSize": 0}))
    assert problem.path == "spec.engine.args.tensorParallelSize"


def test_single_device_engines_are_unchanged() -> None:
    pod = _pod(_engine(args={}))
    assert pod["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
