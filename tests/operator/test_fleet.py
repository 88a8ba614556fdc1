"""Fleet rollouts through the real operator: a RolloutPolicy over six InferenceServices (issue 47).

The routers' metrics are fake (one /metrics for every router pod, each service's series under its own
``isvc`` label) and the test plays the Job controller and kubelet for every service at once. One service's
new revision fails every request: its canary rolls back, the policy (failureBudget 1) halts, the canary
already running next to it finishes on its own evidence, and the four others wait on stable with
Progressing=True, reason WaitingForRolloutPolicy. `folio fleet resume` lets them go on, wave by wave (c and d
in wave 1, then e and f, unlabelled, last), at most two at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from folio.operator.k8s.names import component_labels
from folio.operator.local.cli_fleet import main as fleet_main
from folio.operator.router.metrics import RouterMetrics
from tests.operator.harness import (
    NAMESPACE,
    ApiServer,
    Background,
    Cluster,
    condition,
    eventually,
    in_background,
    isvc_manifest,
    rev_of,
    running_operator,
    write_kubeconfig,
)

pytestmark = [pytest.mark.timeout(90), pytest.mark.kmock(cls=ApiServer)]

POLICY = "serving.folio.dev/v1alpha1"
WAVES = {"a": "0", "b": "0", "c": "1", "d": "1", "e": None, "f": None}
FAULTY = "b"
NEW_ARGS = {"engine": {"args": {"maxNumSeqs": 8}}}


def rollout(name: str) -> dict[str, Any]:
    pause = "6s" if name == "a" else "1s"  # a's canary outlasts b's rollback: it finishes after the halt
    return {"steps": [{"weight": 50, "pause": pause}],
            "analysis": {"interval": "1s", "minRequests": 3, "failureLimit": 1}, "drainPeriod": "0s"}


def manifest(name: str, **extra: Any) -> dict[str, Any]:
    m = isvc_manifest(name, rollout=rollout(name), **extra)
    labels = {"tier": "prod", **({"folio.dev/wave": WAVES[name]} if WAVES[name] is not None else {})}
    m["metadata"]["labels"] = labels
    return m


class Kubelet(Background):
    """Every pre-pull Job succeeds and every engine Deployment has its replicas ready."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    async def _run(self) -> None:
        c = self.cluster
        while True:
            for job in await c.call(c.kube.list, "batch/v1", "Job", NAMESPACE, {}):
                if not (job.get("status") or {}).get("succeeded"):
                    await c.set_status("batch/v1", "Job", job["metadata"]["name"], {
                        "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]})
            for dep in await c.call(c.kube.list, "apps/v1", "Deployment", NAMESPACE, {}):
                want = dep["spec"].get("replicas", 0)
                if "-router" in dep["metadata"]["name"]:
                    continue
                if (dep.get("status") or {}).get("readyReplicas") != want:
                    await c.set_status("apps/v1", "Deployment", dep["metadata"]["name"],
                                       {"readyReplicas": want, "replicas": want})
            await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def routers(cluster: Cluster, old: dict[str, str], new: dict[str, str]) -> AsyncIterator[None]:
    """A router pod per service on one shared /metrics: quick answers from each revision, the faulty new one
    failing all of its own."""
    # two buckets: six services' series stay small enough to scrape every second on a busy machine
    metrics = {name: RouterMetrics(name, buckets=(0.05, 1.0)) for name in old}
    rendered: list[bytes] = [b""]  # what every scrape gets: rendered by the load loop, not once per scrape

    def render() -> bytes:
        return b"".join(m.render() for m in metrics.values())

    cluster.server["get /metrics"] << (lambda: rendered[0])
    port = cluster.server.url.port
    for name in old:
        await cluster.call(cluster.kube.create, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-router-1", "namespace": NAMESPACE,
                         "labels": component_labels(name, "router")},
            "spec": {"containers": [{"name": "router", "ports": [{"name": "http", "containerPort": port}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1"},
        })  # fmt: skip

    async def serve() -> None:
        while True:
            for name, m in metrics.items():
                for rev, code in ((old[name], "200"), (new[name], "500" if name == FAULTY else "200")):
                    m.attempt_started(rev)
                    m.attempt_finished(rev, code, 0.01)
                    m.first_byte(rev, 0.005)
            rendered[0] = render()
            await asyncio.sleep(0.25)

    async with in_background(serve):
        yield




async def policy(cluster: Cluster) -> dict[str, Any]:
    found = await cluster.get(POLICY, "RolloutPolicy", "fleet")
    assert found is not None
    return found


async def test_a_faulty_service_halts_the_fleet_and_resume_lets_it_proceed(
        cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    names = list(WAVES)
    old = {n: rev_of(manifest(n)) for n in names}
    new = {n: rev_of(manifest(n, **NEW_ARGS)) for n in names}
    await cluster.call(cluster.kube.create, {
        "apiVersion": POLICY, "kind": "RolloutPolicy",
        "metadata": {"name": "fleet", "namespace": NAMESPACE, "uid": "uid-fleet"},
        "spec": {"selector": {"matchLabels": {"tier": "prod"}}, "maxConcurrent": 2, "failureBudget": 1,
                 "waves": [{"label": "0", "soak": "0s"}, {"label": "1", "soak": "1s"}]},
    })  # fmt: skip
    for name in names:
        await cluster.create_isvc(manifest(name))
    async with running_operator(cluster.server, resync_s=10.0), Kubelet(cluster), routers(cluster, old, new):

        async def all_ready() -> bool:
            for n in names:
                assert condition(await cluster.isvc(n), "Ready").get("status") == "True", n
            return True

        await eventually(all_ready, timeout=20, what="every first revision serving (not gated)")
        for name in names:  # one commit changes the whole fleet
            await cluster.update_spec(name, NEW_ARGS)

        async def halted() -> dict[str, Any]:
            p = await policy(cluster)
            st = p.get("status") or {}
            assert st.get("phase") == "Halted", st.get("phase")
            assert condition(p, "Halted").get("status") == "True"
            return p

        p = await eventually(halted, timeout=30, what="the policy halted by the faulty service's rollback")
        assert FAULTY in condition(p, "Halted")["message"] and "AnalysisFailed" in condition(p, "Halted")["message"]
        assert [r["name"] for r in p["status"]["rolledBack"]] == [FAULTY]

        async def a_promoted() -> bool:
            return {t["revision"]: t["weight"] for t in (await cluster.isvc("a"))["status"]["traffic"]} == {new["a"]: 100}

        await eventually(a_promoted, timeout=20, what="a's canary finishing on its own evidence after the halt")
        for name in "cdef":  # still on stable, waiting, with the policy and wave named
            isvc = await cluster.isvc(name)
            assert {t["revision"]: t["weight"] for t in isvc["status"]["traffic"]} == {old[name]: 100}, name
            assert isvc["status"].get("canaryRevision") is None, name
            progressing = condition(isvc, "Progressing")
            assert (progressing["status"], progressing["reason"]) == ("True", "WaitingForRolloutPolicy"), name
            assert "RolloutPolicy fleet" in progressing["message"], progressing
        p = await policy(cluster)
        assert sorted(p["status"]["pending"]) == list("cdef") and p["status"]["promoted"] == ["a"]

        async def exported() -> bool:  # the operator's /metrics (its registry is this process's)
            labels = {"namespace": NAMESPACE, "policy": "fleet"}
            assert REGISTRY.get_sample_value("folio_rollout_policy_halted", labels) == 1
            assert REGISTRY.get_sample_value("folio_rollout_policy_services", {**labels, "phase": "Pending"}) == 4
            assert REGISTRY.get_sample_value("folio_rollout_policy_services", {**labels, "phase": "RolledBack"}) == 1
            return True

        await eventually(exported, what="folio_rollout_policy_halted and folio_rollout_policy_services")

        # `folio fleet status` and `folio fleet resume` against the emulator
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", str(cluster.server.url))))
        args = argparse.Namespace(action="status", name="fleet", namespace=NAMESPACE, output="table")
        assert await asyncio.to_thread(fleet_main, args) == 0  # a synchronous client: off the emulator's loop
        table = capsys.readouterr().out
        assert "Halted" in table and FAULTY in table and "RolledBack" in table, table
        args = argparse.Namespace(action="resume", name="fleet", namespace=NAMESPACE, output="table")
        assert await asyncio.to_thread(fleet_main, args) == 0

        async def everyone_else_promoted() -> bool:
            for name in "acdef":
                weights = {t["revision"]: t["weight"] for t in (await cluster.isvc(name))["status"]["traffic"]}
                assert weights == {new[name]: 100}, (name, weights)
            return True

        await eventually(everyone_else_promoted, timeout=40, what="the fleet proceeding after the resume")

        async def idle() -> dict[str, Any]:
            p = await policy(cluster)
            assert condition(p, "Halted").get("status") == "False" and p["status"]["phase"] == "Idle", p["status"]
            return p

        p = await eventually(idle, timeout=10, what="the policy idle, its budget whole again")
        assert sorted(p["status"]["promoted"]) == list("acdef") and p["status"]["pending"] == []
        faulty = await cluster.isvc(FAULTY)
        assert {t["revision"]: t["weight"] for t in faulty["status"]["traffic"]} == {old[FAULTY]: 100}
    admitted = [e["message"] for e in await cluster.events("CanaryAdmitted")]
    order = [next(n for n in names if m.startswith(f"{n} ")) for m in admitted]
    assert max(order.index(n) for n in "cd") < min(order.index(n) for n in "ef"), order  # waves in order
