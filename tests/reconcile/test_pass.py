"""The one reconcile pass, against a runtime that records what it is asked (the cluster's and `folio up`'s
runtimes run this same pass in tests/operator and tests/local)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import httpx

from folio.operator.parity import SuitePrompt
from folio.operator.reconcile import Capacity, Memory, Target, run_pass
from folio.operator.rollout import Decision, Observed, RevisionFacts
from folio.operator.serving.plan import Placement, ServingPlan
from folio.operator.serving.validate import CLUSTER, THIS_MACHINE, Site
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus, ParitySpec, revision_name

DIGEST = "sha256:" + "ab" * 32
SPEC: dict[str, Any] = {"model": {"source": "file:///models/m", "digest": DIGEST}, "replicas": 2}
ROUTER_METRICS = "http://router.test/metrics"


@dataclass
class Recorder:
    """A runtime that reports what a test sets and records every call, in order."""

    site: Site = CLUSTER
    placement: Placement = field(default_factory=Placement.cluster)
    keda: bool = False
    http: httpx.AsyncClient | None = None
    facts: dict[str, RevisionFacts] = field(default_factory=dict)
    overrides: frozenset[str] = frozenset()
    ready: int = 0
    calls: list[str] = field(default_factory=list)
    executed: list[tuple[ServingPlan | None, Decision]] = field(default_factory=list)

    async def observe(self, spec: InferenceServiceSpec, status: InferenceServiceStatus, now: datetime) -> Observed:
        self.calls.append("observe")
        return Observed(now=now, revisions=dict(self.facts), overrides=self.overrides)

    def router_metrics(self) -> list[str]:
        self.calls.append("router_metrics")
        return [ROUTER_METRICS] if self.http is not None else []

    def capacity(self, status: InferenceServiceStatus) -> Capacity:
        self.calls.append("capacity")
        return Capacity(self.ready, 0)

    def replica_urls(self, revision: str) -> Sequence[str]:
        return []

    def adapter_weights(self, revision: str) -> tuple[Literal["pending", "ready", "failed"], str]:
        raise AssertionError("no adapters in these specs")

    def engines(self, revision: str) -> Sequence[str]:
        raise AssertionError("no engine serves adapters in these specs: none is asked what it holds")

    async def mark_engines(self, holding: Mapping[str, bool]) -> None:
        raise AssertionError("no engine serves adapters in these specs")

    def suite(self, gate: ParitySpec) -> Callable[[], Awaitable[list[SuitePrompt]]]:
        raise AssertionError("no gate in these specs")

    def endpoints(self) -> Mapping[str, Sequence[str]]:
        return {rev: ["http://127.0.0.1:9000"] for rev in self.facts}

    async def execute(self, serving: ServingPlan | None, decision: Decision) -> None:
        self.calls.append("execute")
        self.executed.append((serving, decision))


async def one_pass(runtime: Recorder, memory: Memory, spec: Any, status: InferenceServiceStatus,
                   name: str = "chat", generation: int = 1) -> Decision:
    outcome = await run_pass(runtime, memory, Target(name, spec, generation, status))
    return outcome.decision


async def test_a_first_revision_is_admitted_and_planned_but_nothing_runs_before_its_weights() -> None:
    runtime, memory = Recorder(), Memory("chat")
    decision = await one_pass(runtime, memory, SPEC, InferenceServiceStatus())
    rev = revision_name(InferenceServiceSpec.model_validate(SPEC))
    assert decision.status.stable_revision == rev and decision.status.traffic == []
    serving, executed = runtime.executed[-1]
    assert executed is decision and serving is not None
    planned = serving.revision(rev)
    assert planned is not None and planned.pull_weights and planned.replicas == 0
    assert runtime.calls.index("observe") < runtime.calls.index("execute")


async def test_the_plan_follows_the_decision_the_same_pass_made() -> None:
    runtime, memory = Recorder(), Memory("chat")
    first = await one_pass(runtime, memory, SPEC, InferenceServiceStatus())
    rev = first.status.stable_revision
    assert rev is not None
    runtime.facts = {rev: RevisionFacts("ready", ready_replicas=2)}
    decision = await one_pass(runtime, memory, SPEC, first.status)
    assert [(t.revision, t.weight) for t in decision.status.traffic] == [(rev, 100)]
    serving, _ = runtime.executed[-1]
    assert serving is not None
    assert serving.revision(rev).replicas == 2  # type: ignore[union-attr]
    assert serving.router.stable == rev and [t.weight for t in serving.router.traffic] == [100]
    assert serving.router.endpoints == {rev: ["http://127.0.0.1:9000"]}


async def test_a_refused_spec_keeps_what_runs_and_names_the_field_once() -> None:
    runtime, memory = Recorder(), Memory("chat")
    first = await one_pass(runtime, memory, SPEC, InferenceServiceStatus())
    bad = {**SPEC, "engine": {"args": {"noSuchFlag": 1}}}
    decision = await one_pass(runtime, memory, bad, first.status, generation=2)
    degraded = decision.status.condition("Degraded")
    assert degraded is not None and degraded.status == "True"
    assert "spec.engine.args" in degraded.message and "noSuchFlag" in degraded.message
    assert [e.type for e in decision.events] == ["Warning"]
    serving, _ = runtime.executed[-1]
    assert serving is not None and serving.revision(first.status.stable_revision or "") is not None
    assert "observe" not in runtime.calls[runtime.calls.index("execute") + 1:]  # refused before observing
    again = await one_pass(runtime, memory, bad, decision.status, generation=2)
    assert again.events == []  # the same problems: no second Event


async def test_a_spec_the_schema_refuses_plans_nothing() -> None:
    runtime, memory = Recorder(), Memory("chat")
    decision = await one_pass(runtime, memory, {**SPEC, "replicas": "two"}, InferenceServiceStatus())
    assert runtime.executed[-1][0] is None
    degraded = decision.status.condition("Degraded")
    assert degraded is not None and "spec.replicas" in degraded.message


async def test_a_name_children_cannot_carry_plans_nothing() -> None:
    runtime, memory = Recorder(), Memory("chat")
    await one_pass(runtime, memory, SPEC, InferenceServiceStatus(), name="Not_A_Name")
    assert runtime.executed[-1][0] is None


async def test_the_runtime_s_own_rules_apply() -> None:
    spec = {**SPEC, "replicas": 40}
    cluster, local = Recorder(site=CLUSTER), Recorder(site=THIS_MACHINE)
    assert (await run_pass(cluster, Memory("chat"), Target("chat", spec, 1, InferenceServiceStatus()))).problems == ()
    refused = await run_pass(local, Memory("chat"), Target("chat", spec, 1, InferenceServiceStatus()))
    assert [p.path for p in refused.problems] == ["spec.replicas"]


def _router_metrics(in_flight: float) -> str:
    return (
        "# TYPE folio_router_in_flight gauge\n"
        f'folio_router_in_flight{{isvc="chat",revision="r",replica="x"}} {in_flight}\n'
    )


async def test_autoscaling_reads_the_runtime_s_sources_and_sets_status() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        assert str(request.url) == ROUTER_METRICS
        return httpx.Response(200, text=_router_metrics(9))

    spec = {**SPEC, "autoscaling": {"minReplicas": 1, "maxReplicas": 8, "metric": "InFlight", "target": 4}}
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        runtime, memory = Recorder(http=http, ready=1), Memory("chat")
        decision = await one_pass(runtime, memory, spec, InferenceServiceStatus())
    auto = decision.status.autoscaling
    assert auto is not None and auto.desired_replicas == 3  # ceil(9 / 4)
    assert runtime.calls.index("capacity") < runtime.calls.index("execute")
    assert decision.requeue_after is not None and decision.requeue_after <= 5.0


async def test_keda_scales_where_the_runtime_has_it_and_the_pass_where_not() -> None:
    spec = {**SPEC, "autoscaling": {"minReplicas": 1, "maxReplicas": 8, "metric": "InFlight", "target": 4,
                                    "keda": True},
            "rollout": {"analysis": {"prometheus": {"url": "http://prometheus:9090"}}}}
    with_keda = await one_pass(Recorder(keda=True), Memory("chat"), spec, InferenceServiceStatus())
    assert with_keda.status.autoscaling is not None and with_keda.status.autoscaling.keda
    without = await one_pass(Recorder(keda=False, ready=1), Memory("chat"), spec, InferenceServiceStatus())
    assert without.status.autoscaling is not None and not without.status.autoscaling.keda
