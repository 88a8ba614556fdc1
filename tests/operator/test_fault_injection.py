"""The engine's fault-injection args are test aids: a cluster's operator refuses them unless started with
`--allow-fault-injection` (the chart's `faultInjection.enabled`); `folio up` keeps them."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import kopf
import pytest

from folio.operator.controller import cli
from folio.operator.serving.validate import CLUSTER, FAULT_INJECTION_DISABLED
from tests.operator.harness import (
    ApiServer,
    Cluster,
    bring_up,
    condition,
    eventually,
    isvc_manifest,
    point_kubeconfig_at_nothing,
    rev_of,
    running_operator,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.kmock(cls=ApiServer)]

FAULTY = {"args": {"faultErrorRate": 0.5}}
PATH = "spec.engine.args.faultErrorRate"


async def test_a_spec_with_fault_injection_is_refused_by_default(cluster: Cluster) -> None:
    manifest = isvc_manifest(engine=FAULTY)
    async with running_operator(cluster.server):
        await cluster.create_isvc(manifest)

        async def refused() -> dict[str, Any]:
            isvc = await cluster.isvc()
            assert isvc.get("status", {}).get("conditions"), "no conditions yet"
            cond = condition(isvc, "Degraded")
            assert cond["status"] == "True" and cond["reason"] == FAULT_INJECTION_DISABLED, cond
            return cond

        cond = await eventually(refused, what=f"Degraded={FAULT_INJECTION_DISABLED}")
        assert PATH in cond["message"] and "--allow-fault-injection" in cond["message"], cond
        conditions = (await cluster.isvc())["status"]["conditions"]
        assert not [c for c in conditions if c["type"] == "Ready" and c["status"] == "True"], conditions
        events = await eventually(lambda: cluster.events(FAULT_INJECTION_DISABLED), what="a Warning Event")
        assert events[0]["type"] == "Warning"
        # nothing of the refused revision runs
        assert await cluster.get("batch/v1", "Job", f"chat-prepull-{rev_of(manifest)}") is None
        assert await cluster.get("apps/v1", "Deployment", f"chat-{rev_of(manifest)}") is None


async def test_a_spec_with_fault_injection_runs_when_the_operator_allows_it(cluster: Cluster) -> None:
    manifest = isvc_manifest(engine=FAULTY)
    async with running_operator(cluster.server, site=dataclasses.replace(CLUSTER, fault_injection=True)):
        rev = await bring_up(cluster, manifest)
        assert condition(await cluster.isvc(), "Degraded")["status"] == "False"
        dep = await cluster.get("apps/v1", "Deployment", f"chat-{rev}")
        assert dep is not None
        command = [*dep["spec"]["template"]["spec"]["containers"][0].get("command", []),
                   *dep["spec"]["template"]["spec"]["containers"][0].get("args", [])]  # fmt: skip
        assert "--fault-error-rate" in command, command
        assert not await cluster.events(FAULT_INJECTION_DISABLED)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_flag_makes_the_operators_site() -> None:
    assert cli.site(_args()) == CLUSTER and not CLUSTER.fault_injection
    allowed = cli.site(_args("--allow-fault-injection"))
    assert allowed.fault_injection and allowed == dataclasses.replace(CLUSTER, fault_injection=True)


@pytest.mark.parametrize(("argv", "allowed"), [((), False), (("--allow-fault-injection",), True)])
def test_main_hands_the_site_to_the_context(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                            argv: tuple[str, ...], allowed: bool) -> None:
    point_kubeconfig_at_nothing(tmp_path, monkeypatch)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    captured: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: captured.update(kwargs))
    args = _args("-n", "ml", "--metrics-port", "0", "--health-port", "0", "--peering", "", *argv)
    assert cli.main(args) == 0
    assert captured["memo"].ctx.site.fault_injection is allowed
