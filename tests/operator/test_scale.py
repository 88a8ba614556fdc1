"""A 30-service slice of the scale bench (bench/scale.py): one `folio operator` process, 30 InferenceServices
in 3 namespaces, the cluster's other controllers and the routers played by `harness.Fleet`.

All 30 become Ready; idle, the operator makes at most 2 API requests per service per minute (it watches,
it does not poll); a fleet bump of all 30 at once, 3 of them faulty by their routers' metrics: those roll
back within the issue's bound (`failureLimit x interval + 3 s`) of their canary taking traffic, the others
promote.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from folio.operator.controller.children import INDEXED_KINDS
from folio.operator.controller.handlers import OWN_OBJECTS
from folio.operator.k8s.names import PLURALS
from tests.operator.harness import (
    FLEET_FAILURE_LIMIT,
    FLEET_INTERVAL_S,
    NAMESPACE,
    Cluster,
    Fleet,
    ScaleApiServer,
    bring_up,
    eventually,
    isvc_manifest,
    operator_processes,
    running_operator,
)

pytestmark = [pytest.mark.kmock(cls=ScaleApiServer)]

SERVICES = 30
NAMESPACES = ["team-a", "team-b", "team-c"]
RESYNC_S = 5.0  # half `folio operator`'s default: the idle window (two resyncs) is shorter, its rate the same
IDLE_TARGET = 2.0  # API requests per service per minute
# The routers are scraped every interval before the canary takes traffic too, so its first sample is
# a verdict: failureLimit failing samples, then the rollback, with 3 s for the pass and the routers' lag.
ROLLBACK_BOUND_S = FLEET_FAILURE_LIMIT * FLEET_INTERVAL_S + 3.0


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_thirty_services_ready_idle_and_bumped(cluster: Cluster, tmp_path: Path) -> None:
    async with Fleet(cluster.server, NAMESPACES, SERVICES) as fleet, \
            operator_processes(cluster.server, tmp_path) as replicas:
        op = replicas.start("operator", "--peering", "", "--resync-seconds", f"{RESYNC_S:g}",
                            namespaces=tuple(NAMESPACES))
        await eventually(lambda: fleet.watching(NAMESPACES), timeout=60, what="the operator's watches")
        await fleet.create()

        async def all_ready() -> bool:
            assert op.proc.poll() is None, f"the operator exited:\n{op.log()[-3000:]}"
            return fleet.ready() == SERVICES

        await eventually(all_ready, timeout=90, what=f"{SERVICES} services Ready")

        # Idle: the last passes' writes settle within a resync; then a window of two resyncs, in which
        # every service's clock runs twice. (A measurement window, not a wait for a state.)
        await asyncio.sleep(RESYNC_S)
        before, started = fleet.operator_requests(), time.monotonic()
        await asyncio.sleep(2 * RESYNC_S)
        per_minute = (fleet.operator_requests() - before) / SERVICES / ((time.monotonic() - started) / 60)
        print(f"idle: {per_minute:.2f} API requests per service per minute")
        assert per_minute <= IDLE_TARGET

        faulty = {svc.name for svc in fleet.services[::10]}
        await fleet.bump(fleet.services, faulty=faulty)

        async def decided() -> bool:
            assert op.proc.poll() is None, f"the operator exited:\n{op.log()[-3000:]}"
            return all(svc.canary_done is not None for svc in fleet.services)

        await eventually(decided, timeout=120, what="every canary rolled back or promoted")
    current = fleet.isvcs()
    for svc in fleet.services:
        status = current[(svc.namespace, svc.name)]["status"]
        traffic = {t["revision"]: t["weight"] for t in status["traffic"]}
        assert svc.canary_first is not None and svc.canary_done is not None
        if svc.faulty:
            assert traffic == {svc.stable: 100}, (svc.name, traffic)
            assert [f["reason"] for f in status["failedRevisions"]] == ["AnalysisFailed"], svc.name
            took = svc.canary_done - svc.canary_first
            assert took <= ROLLBACK_BOUND_S, f"{svc.name} rolled back {took:.1f} s after taking traffic"
        else:
            assert status["stableRevision"] != svc.stable and list(traffic.values()) == [100], (svc.name, traffic)


async def test_children_and_pods_are_watched_by_label(cluster: Cluster) -> None:
    """Every watch of a child kind or of pods asks the API server for Folio's objects only (a server-side
    label selector), and the service still comes up through them, among pods that are not Folio's."""
    server = cluster.server
    assert isinstance(server, ScaleApiServer)
    for i in range(20):
        await cluster.call(cluster.kube.create, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"other-{i}", "namespace": NAMESPACE},
            "status": {"phase": "Running"}})  # fmt: skip
    async with running_operator(server):
        await bring_up(cluster, isvc_manifest())
    watches = {(c.plural, c.label_selector) for c in server.calls if c.watch}
    children = {PLURALS[kind] for kind in INDEXED_KINDS if not kind[0].startswith("keda.sh/")}  # KEDA: not served
    assert {plural for plural, _ in watches} >= children | {"inferenceservices"}
    for plural, selector in watches:
        assert selector == (OWN_OBJECTS if plural in children else ""), plural
