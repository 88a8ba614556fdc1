"""`folio up` and a replica that spans several pods in a cluster: each replica is a group of `folio serve`
processes wired with LeaderWorkerSet's environment on loopback, restarted together when one of them exits
(the engine itself is not needed: the processes here stand in for it)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import psutil

from folio.operator.local.runtime import replica_processes
from folio.operator.local.supervisor import Supervisor
from folio.operator.serving.plan import Placement, plan
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus, RevisionStatus, revision_name
from tests.local.test_supervisor import FAKE, _earlier_children, descendants, until  # noqa: F401  (autouse)

DIGEST = "sha256:" + "ab" * 32


def _rev(tmp_path: Path, args: dict[str, int], gpus: int = 8):  # type: ignore[no-untyped-def]
    spec = InferenceServiceSpec.model_validate({
        "model": {"source": "file:///models/llama", "digest": DIGEST}, "replicas": 2,
        "engine": {"args": args, "resources": {"limits": {"nvidia.com/gpu": gpus}}},
    })  # fmt: skip
    status = InferenceServiceStatus(revisions=[RevisionStatus(
        name=revision_name(spec), role="Stable", model=spec.model, image=spec.engine.image, args=dict(spec.engine.args),
        weights_ready=True)])  # fmt: skip
    (rev,) = plan("chat", spec, status, Placement.this_machine(tmp_path)).revisions
    return rev


def test_each_replica_is_a_group_of_processes_wired_like_leader_worker_set(tmp_path: Path) -> None:
    rev = _rev(tmp_path, {"tensorParallelSize": 4, "pipelineParallelSize": 4})  # 16 ranks, 8 GPUs a pod
    assert rev.group_size == 2
    leader, worker = replica_processes(rev, 41000, 42000)
    (argv, env), (w_argv, w_env) = leader, worker
    assert argv[:3] == [sys.executable, "-m", "folio.operator.cli"] and argv[3] == "serve"
    for flag, value in (("--port", "41000"), ("--host", "127.0.0.1"), ("--nnodes", "2"), ("--master-port", "42000"),
                        ("--tensor-parallel-size", "4"), ("--pipeline-parallel-size", "4")):
        assert argv[argv.index(flag) + 1] == value
    assert "--headless" not in argv
    assert w_argv[-1] == "--headless" and "--port" not in w_argv
    assert w_argv[w_argv.index("--master-port") + 1] == "42000" and w_argv[w_argv.index("--nnodes") + 1] == "2"
    assert env == {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "0"}
    assert w_env == {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}
    # the weights, the pin and the served name are the same on every node
    for flag in ("--model", "--digest", "--served-model-name"):
        assert w_argv[w_argv.index(flag) + 1] == argv[argv.index(flag) + 1]
    four = replica_processes(_rev(tmp_path, {"pipelineParallelSize": 4}, gpus=1), 41000, 42000)
    assert [e["LWS_WORKER_INDEX"] for _, e in four] == ["0", "1", "2", "3"]
    assert all(e["LWS_GROUP_SIZE"] == "4" for _, e in four)


def test_ranks_that_fit_one_pod_stay_one_process(tmp_path: Path) -> None:
    rev = _rev(tmp_path, {"tensorParallelSize": 4, "pipelineParallelSize": 2})
    assert rev.group_size == 1
    assert "--nnodes" not in rev.serve_args(41000)


def _worker(record: Path) -> list[str]:
    """A worker stand-in: writes the LeaderWorkerSet environment it got, then waits to be stopped."""
    code = ("import os, sys, time; open(sys.argv[1], 'w').write(' '.join(os.environ[k] for k in "
            "('LWS_LEADER_ADDRESS', 'LWS_GROUP_SIZE', 'LWS_WORKER_INDEX'))); time.sleep(600)")
    return [sys.executable, "-c", code, str(record)]


async def test_a_group_whose_worker_dies_restarts_whole(tmp_path: Path) -> None:
    events: list[str] = []
    sup = Supervisor(tmp_path / "logs", backoff_base=0.1, on_event=events.append)
    masters: list[int] = []

    def processes(port: int, master: int) -> list[tuple[list[str], dict[str, str]]]:
        masters.append(master)
        env = {"LWS_LEADER_ADDRESS": "127.0.0.1", "LWS_GROUP_SIZE": "3"}
        return [([sys.executable, FAKE, str(port)], {**env, "LWS_WORKER_INDEX": "0"}),
                *((_worker(tmp_path / f"node{n}"), {**env, "LWS_WORKER_INDEX": str(n)}) for n in (1, 2))]

    sup.ensure_groups("rev1", 2, processes)
    assert len(set(masters)) == 2, "a master port per replica"
    await until(lambda: sup.ready_count("rev1") == 2 and len(sup.pids("rev1")) == 6, sup=sup)
    await until(lambda: all((tmp_path / f"node{n}").exists() for n in (1, 2)))
    assert (tmp_path / "node2").read_text() == "127.0.0.1 3 2"
    first, second = sup.groups["rev1"]
    before = {p.pid for p in first.procs()}
    untouched = {p.pid for p in second.procs()}
    os.kill(first.workers[1].proc.pid, signal.SIGKILL)  # type: ignore[union-attr]
    await until(lambda: sup.restarts("rev1") == 1, sup=sup)
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in before), "the group's other processes go with it"
    await until(lambda: sup.ready_count("rev1") == 2 and len(sup.pids("rev1")) == 6, sup=sup)
    assert not before & {p.pid for p in first.procs()}, "every process of the group started again"
    assert {p.pid for p in second.procs()} == untouched, "the other replica is left alone"
    assert any("node 2 of 3: the whole group restarts" in e and "exited with code -9" in e for e in events), events
    await sup.stop_all()
    assert descendants() == []
