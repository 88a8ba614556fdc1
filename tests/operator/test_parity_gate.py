"""The parity gate in the real operator (kopf against kmock), the replicas' parity endpoints served over
HTTP by the engine's own app on fake engines: a canary that answers differently is rolled back
(ParityFailed) before it takes traffic; a missing ConfigMap suite is a Degraded reason until it appears."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from folio.operator.parity import gate as parity_gate
from tests.operator.harness import (
    NAMESPACE,
    ApiServer,
    Cluster,
    condition,
    eventually,
    isvc_manifest,
    rev_of,
    running_operator,
    serve_first_revision,
)
from tests.server.conftest import serving_fake
from tests.server.fake_engine import FakeEngine

pytestmark = [pytest.mark.timeout(90), pytest.mark.kmock(cls=ApiServer)]

ROLLOUT = {"steps": [{"weight": 10, "pause": "10m"}], "parity": {"prompts": 6, "maxTokens": 4}}


class OffEngine(FakeEngine):
    """Answers like FakeEngine but with every mean-logit vector reversed: a revision that is "wrong"."""

    def _output(self, seq):  # type: ignore[no-untyped-def]
        out = super()._output(seq)
        if out.prompt_logits_mean is not None:
            out.prompt_logits_mean = out.prompt_logits_mean.flip(0)
        return out


@contextlib.contextmanager
def replicas(**engines: FakeEngine) -> Iterator[dict[str, str]]:
    with contextlib.ExitStack() as stack:
        yield {name: stack.enter_context(serving_fake(engine)).url for name, engine in engines.items()}


async def start_canary(cluster: Cluster, rollout: dict[str, Any]) -> tuple[str, str]:
    first = isvc_manifest(rollout=rollout)
    await cluster.create_isvc(first)
    stable = await serve_first_revision(cluster, first)
    await cluster.update_spec("chat", {"engine": {"args": {"maxNumSeqs": 8}}})
    canary = rev_of(isvc_manifest(rollout=rollout, engine={"args": {"maxNumSeqs": 8}}))
    await eventually(lambda: cluster.get("batch/v1", "Job", f"chat-prepull-{canary}"), what="canary pre-pull")
    await cluster.set_status("batch/v1", "Job", f"chat-prepull-{canary}", {"succeeded": 1})
    await cluster.set_status("apps/v1", "Deployment", f"chat-{canary}", {"readyReplicas": 1})
    return stable, canary


async def test_a_canary_answering_differently_is_rolled_back_before_traffic(cluster: Cluster) -> None:
    with replicas(good=FakeEngine(), off=OffEngine()) as urls:
        routes: dict[str, str] = {}
        async with running_operator(cluster.server, replica_url=lambda ns, isvc, rev: routes[rev]):
            routes[rev_of(isvc_manifest(rollout=ROLLOUT))] = urls["good"]
            routes[rev_of(isvc_manifest(rollout=ROLLOUT, engine={"args": {"maxNumSeqs": 8}}))] = urls["off"]
            stable, canary = await start_canary(cluster, ROLLOUT)
            traffic_seen: list[list[dict[str, Any]]] = []

            async def rolled_back() -> dict[str, Any] | None:
                status = (await cluster.isvc())["status"]
                traffic_seen.append(status["traffic"])
                return next((f for f in status.get("failedRevisions", []) if f["revision"] == canary), None)

            failed = await eventually(rolled_back, 30, "the parity gate rolling the canary back")
            assert failed["reason"] == "ParityFailed" and failed["parity"]["verdict"] == "Fail"
            assert failed["parity"]["prompts"] == 6 and failed["parity"]["meanCosine"] < 0.9
            assert all(t == [{"revision": stable, "weight": 100}] for t in traffic_seen), "no canary traffic"
            isvc = await cluster.isvc()
            assert condition(isvc, "Degraded")["reason"] == "ParityFailed"
            assert "mean cosine" in condition(isvc, "Degraded")["message"]
            diff = await eventually(lambda: cluster.events("ParityDiff"), what="the ParityDiff Event")
            assert diff[0]["type"] == "Warning" and "worst prompts" in diff[0]["message"]


async def test_a_missing_configmap_suite_is_degraded_until_it_exists(cluster: Cluster, monkeypatch) -> None:
    monkeypatch.setattr(parity_gate, "RETRY_S", 1.0)
    rollout = {**ROLLOUT, "parity": {**ROLLOUT["parity"], "configMapRef": {"name": "suite", "key": "s.jsonl"}}}
    with replicas(good=FakeEngine()) as urls:
        async with running_operator(cluster.server, replica_url=lambda ns, isvc, rev: urls["good"]):
            stable, canary = await start_canary(cluster, rollout)

            async def degraded() -> dict[str, Any] | None:
                d = condition(await cluster.isvc(), "Degraded")
                return d if d["reason"] == "ParityGateError" else None

            d = await eventually(degraded, 30, "Degraded for the missing ConfigMap")
            assert f"ConfigMap {NAMESPACE}/suite not found" in d["message"]
            isvc = await cluster.isvc()
            assert isvc["status"]["traffic"] == [{"revision": stable, "weight": 100}]
            assert condition(isvc, "Ready")["status"] == "True"

            suite = '{"prompt": "hello"}\n{"messages": [{"role": "user", "content": "hi"}]}\n'
            await cluster.call(cluster.kube.create, {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "suite", "namespace": NAMESPACE, "resourceVersion": "1"},
                "data": {"s.jsonl": suite},
            })

            async def stepped() -> list[dict[str, Any]] | None:
                traffic = (await cluster.isvc())["status"]["traffic"]
                return traffic if len(traffic) == 2 else None

            traffic = await eventually(stepped, 30, "step 1 after the gate passed")
            assert traffic == [{"revision": stable, "weight": 90}, {"revision": canary, "weight": 10}]
            report = (await cluster.isvc())["status"]["canary"]["parity"]
            assert report["verdict"] == "Pass" and report["prompts"] == 2
