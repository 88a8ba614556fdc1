"""`run_pass`: one reconcile pass of an InferenceService, wherever it runs.

Level-based: a pass looks at everything afresh, so missing one costs nothing but time. A spec that
cannot be run is refused in status (Degraded=True naming each field, one Event per distinct problem)
and what already runs keeps running; the runtime's own failures (an API error, a process that will not
start) propagate for its caller to back off.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import httpx

from folio.operator.analysis.sampler import IntervalSampler
from folio.operator.autoscaling.load import LoadMeter
from folio.operator.parity import GateRunner, poll_gate
from folio.operator.reconcile.adapters import Adapters
from folio.operator.reconcile.runtime import Runtime
from folio.operator.reconcile.scale import scale
from folio.operator.rollout import Decision, Event, Observed, advance
from folio.operator.rollout.adapters import advance_adapters, fold, set_fit
from folio.operator.rollout.conditions import invalid_spec
from folio.operator.serving.plan import plan
from folio.operator.serving.validate import Problem, parse
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus

SYNCED_S = 1.0  # after adapters were loaded or unloaded, the next pass this soon


@dataclass(frozen=True)
class Target:
    """The InferenceService a pass is about, as just read."""

    name: str
    spec: Mapping[str, Any] | InferenceServiceSpec  # as written: the pass validates it
    generation: int | None
    status: InferenceServiceStatus


@dataclass
class Memory:
    """What a pass keeps for the next one of the same InferenceService (in memory: a restart loses only
    an interval's baseline, a gate in flight and the autoscaler's last counters)."""

    isvc: str
    sampler: IntervalSampler = field(init=False)
    parity: GateRunner = field(default_factory=GateRunner)  # the parity gate in flight, if any
    meter: LoadMeter = field(init=False)
    adapters: Adapters = field(init=False)  # what the engines hold; each adapter's sampler and gate

    def __post_init__(self) -> None:
        self.sampler = IntervalSampler(self.isvc)
        self.meter = LoadMeter(self.isvc)
        self.adapters = Adapters(self.isvc)


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    problems: Sequence[Problem] = ()  # why the spec was refused; empty when the pass ran


async def run_pass(runtime: Runtime, memory: Memory, target: Target) -> Outcome:
    now = datetime.now(timezone.utc)
    spec, problems = parse(target.name, target.spec, runtime.site)
    if spec is None or problems:
        decision = refuse(target.status, problems, target.generation, now)
        # What already runs keeps running (and repaired) while the spec waits for a fix; with no usable
        # spec or a name its children cannot carry, nothing can be planned.
        runnable = spec is not None and all(p.path != "metadata.name" for p in problems)
        serving = plan(target.name, spec, target.status, runtime.placement, runtime.endpoints()) if runnable else None
        await runtime.execute(serving, decision)
        return Outcome(decision, tuple(problems))

    async with contextlib.AsyncExitStack() as stack:
        http = runtime.http or await stack.enter_async_context(httpx.AsyncClient(trust_env=False))
        observed = await runtime.observe(spec, target.status, now)
        observed = await memory.adapters.observe(runtime, spec, target.status, observed, http)
        observed = await _sample(runtime, memory, spec, target.status, observed, http)
        observed = _gate(runtime, memory, spec, target.status, observed)
        decision = advance(spec, target.generation, target.status, observed)
        _advance_adapters(spec, target, observed, decision)
        await scale(runtime, memory.meter, spec, decision, http, now)
        serving = plan(target.name, spec, decision.status, runtime.placement,
                       memory.adapters.endpoints(runtime, decision.status))
        await runtime.execute(serving, decision)
        synced = await memory.adapters.sync(runtime, serving, http)  # the router follows the plan already
    ended = datetime.now(timezone.utc)
    memory.sampler.restart(spec.rollout.analysis, decision.status, ended)  # a canary's samples count from its traffic
    memory.adapters.restart(spec, decision.status, ended)
    decision.requeue_after = memory.sampler.requeue(decision.requeue_after, decision.status, ended)
    if synced:  # engines just loaded or unloaded adapters: the next pass puts them in rotation
        decision.requeue_after = min(decision.requeue_after or SYNCED_S, SYNCED_S)
    return Outcome(decision)


def _advance_adapters(spec: InferenceServiceSpec, target: Target, observed: Observed, decision: Decision) -> None:
    """Each adapter's rollout (`folio.operator.rollout.adapters`), into the base revisions' decision."""
    if not spec.adapters and not target.status.adapters:
        return
    d = advance_adapters(spec, target.generation, target.status, observed)
    decision.status.adapters = d.adapters
    decision.events.extend(d.events)
    decision.overrides_done = decision.overrides_done | {
        f"{o}@{name}" for name, done in d.overrides_done.items() for o in done}
    fold(target.status.conditions, decision.status, generation=target.generation, now=observed.now)
    warning = set_fit(target.status.conditions, spec, decision.status, generation=target.generation, now=observed.now)
    if warning is not None:
        decision.events.append(warning)
    due = [x for x in (decision.requeue_after, d.requeue_after) if x is not None]
    decision.requeue_after = min(due) if due else None


async def _sample(runtime: Runtime, memory: Memory, spec: InferenceServiceSpec, status: InferenceServiceStatus,
                  observed: Observed, http: httpx.AsyncClient) -> Observed:
    """An analysis sample once per interval (the routers are scraped even without a canary: a baseline)."""
    if not memory.sampler.due(spec.rollout.analysis, observed.now):
        return observed
    sample = await memory.sampler.take(http, runtime.router_metrics(), status=status, spec=spec.rollout.analysis,
                                       now=observed.now)
    return observed if sample is None else dataclasses.replace(observed, analysis=sample)


def _gate(runtime: Runtime, memory: Memory, spec: InferenceServiceSpec, status: InferenceServiceStatus,
          observed: Observed) -> Observed:
    """The parity gate that is due runs in the background, across passes; its report arrives once."""
    gate = spec.rollout.parity

    def load_suite() -> Any:
        assert gate is not None  # a gate only starts when the spec asks for one
        return runtime.suite(gate)()

    report = poll_gate(memory.parity, runtime.http, spec, status, observed.now, urls=runtime.replica_urls,
                       load_suite=load_suite)
    return observed if report is None else dataclasses.replace(observed, parity=report)


def refuse(status: InferenceServiceStatus, problems: Sequence[Problem], generation: int | None,
           now: datetime) -> Decision:
    """Degraded=True naming every problem; an Event only when the problems differ from what status says."""
    reason = problems[0].reason if problems else "InvalidSpec"
    message = "; ".join(str(p) for p in problems) or "the spec cannot be read"
    previous = status.condition("Degraded")
    events = [] if previous is not None and previous.status == "True" and previous.message == message else [
        Event("Warning", reason, message)]
    return Decision(invalid_spec(status, reason, message, generation=generation, now=now), events, frozenset(), None)
