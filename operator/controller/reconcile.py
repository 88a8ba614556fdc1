"""One reconcile pass of an InferenceService; every trigger runs the same one.

    read the object -> its children (indexes) -> observe (+ an analysis sample each interval)
    -> rollout.advance -> serving.plan -> objects -> execute -> write status + Events -> schedule

Level-based: a pass looks at everything afresh, so missing one costs nothing but time. A spec
that cannot be planned is reported in status (Degraded=True, an Event) and what already runs keeps
running; API failures are raised for the handler to back off.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

import httpx
import kopf
import pydantic

from folio.operator.analysis.parity_run import GateRunner, poll_gate
from folio.operator.analysis.parity_sources import cluster_suite
from folio.operator.analysis.sampler import IntervalSampler
from folio.operator.autoscaling.load import LoadMeter
from folio.operator.controller import metrics
from folio.operator.controller.autoscale import autoscale, interval
from folio.operator.controller.children import Children, Expectations
from folio.operator.controller.discovery import OPTIONAL, Discovery, asked_for
from folio.operator.controller.executor import apply_plan
from folio.operator.controller.observe import observe, router_metrics_urls
from folio.operator.k8s.client import ApiError, Kube
from folio.operator.k8s.merge_patch import merge_diff
from folio.operator.k8s.names import ENGINE_PORT, component_labels, engine_name
from folio.operator.rollout import advance
from folio.operator.rollout.conditions import invalid_spec
from folio.operator.serving.errors import PlanningError
from folio.operator.serving.objects import Owner, PlanSettings, objects
from folio.operator.serving.plan import Placement, plan, validate
from folio.operator.spec import (
    API_VERSION,
    DOMAIN,
    KIND,
    SCALE_UP_ANNOTATION,
    AutoscalingStatus,
    InferenceServiceSpec,
    InferenceServiceStatus,
    check_name,
    describe_errors,
)

T = TypeVar("T")


@dataclass
class Schedule:
    """When an InferenceService's clock runs the next pass."""

    wake: asyncio.Event = field(default_factory=asyncio.Event)
    due: float | None = None  # monotonic time the last decision asked to be looked at again
    poked: bool = False  # one of its children changed since the last pass began

    def after(self, requeue_after: float | None) -> None:
        """A pass ended: the next one is due ``requeue_after`` seconds from now (None: at the resync)."""
        self.due = None if requeue_after is None else time.monotonic() + requeue_after
        self.wake.set()  # the clock recomputes its wait

    def poke(self) -> None:
        """A child changed (a pod became ready, a Job finished): a pass now."""
        self.poked = True
        self.wake.set()

    def next_pass(self, resync_s: float) -> tuple[float, str]:
        """Seconds until the next pass, and its trigger: a child, the decision's requeue, or the resync."""
        if self.poked:
            return 0.0, "child"
        if self.due is not None and self.due - time.monotonic() < resync_s:
            return max(0.0, self.due - time.monotonic()), "requeue"
        return resync_s, "timer"


def service_url(namespace: str, isvc: str, revision: str) -> str:
    """A revision's engine Service (headless: the name resolves to its ready pods)."""
    return f"http://{engine_name(isvc, revision)}.{namespace}.svc:{ENGINE_PORT}"


@dataclass
class Context:
    """What every handler needs; kopf hands it over as `memo.ctx` (one for the whole operator)."""

    kube: Kube
    plan_settings: PlanSettings = field(default_factory=PlanSettings)
    resync_s: float = 10.0
    # Every InferenceService's schedule, so that an event on a child can poke its owner's clock.
    schedules: dict[tuple[str, str], Schedule] = field(default_factory=dict)
    # (namespace, isvc, revision) -> a replica's base URL, for the parity gate: the revision's Service
    replica_url: Callable[[str, str, str], str] = field(default=service_url)
    # which optional kinds (CRDs that may be absent) the cluster serves; made from `kube` when not given
    discovery: Discovery | None = None

    def __post_init__(self) -> None:
        if self.discovery is None:
            self.discovery = Discovery(self.kube)


    def schedule(self, namespace: str, name: str) -> Schedule:
        return self.schedules.setdefault((namespace, name), Schedule())


def memo_part(memo: kopf.Memo, name: str, make: Callable[[], T]) -> T:
    """A piece of the object's memo, made on first use (kopf gives every object its own memo)."""
    if name not in memo:
        memo[name] = make()
    part: T = memo[name]
    return part


async def reconcile(body: kopf.Body, memo: kopf.Memo, *, trigger: str, logger: logging.Logger,
                    indexes: Mapping[str, Any]) -> None:
    ctx: Context = memo.ctx
    # Handlers and the clock may overlap for one object; their passes must not interleave.
    async with memo_part(memo, "reconcile_lock", asyncio.Lock):
        started = time.monotonic()
        result = "error"
        try:
            result = await _pass(ctx, body, memo, logger, indexes)
        except ApiError as exc:
            metrics.ERRORS.labels(reason=f"api_{exc.status}").inc()
            raise
        finally:
            metrics.RECONCILES.labels(trigger=trigger, result=result).inc()
            metrics.DURATION.labels(trigger=trigger).observe(time.monotonic() - started)


async def _pass(ctx: Context, body: kopf.Body, memo: kopf.Memo, logger: logging.Logger,
                indexes: Mapping[str, Any]) -> str:
    # Read the object afresh rather than trusting the event's body: status is the rollout's
    # memory, and the previous pass (maybe from another trigger) has just written it.
    obj = await call(ctx.kube.get, API_VERSION, KIND, body.meta.namespace, body.meta.name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return "gone"
    isvc = _Isvc(obj)
    now = datetime.now(timezone.utc)
    schedule = ctx.schedule(isvc.namespace, isvc.name)
    schedule.poked = False  # this pass sees every change so far
    expect = memo_part(memo, "expectations", Expectations)
    children = expect.view(Children.from_indexes(indexes, isvc.namespace, isvc.name))
    status = InferenceServiceStatus.model_validate(isvc.status)
    try:
        spec = InferenceServiceSpec.model_validate(isvc.obj.get("spec") or {})
        try:
            check_name(isvc.name)
        except ValueError as exc:  # the API server took it, but Folio's children's names would not fit
            raise PlanningError("InvalidName", str(exc)) from None
        validate(spec)
    except pydantic.ValidationError as exc:
        await _report_invalid(ctx, body, isvc, status, "InvalidSpec", describe_errors(exc, "spec"), now, logger)
        schedule.after(None)
        return "invalid"
    except PlanningError as exc:
        await _report_invalid(ctx, body, isvc, status, exc.reason, exc.message, now, logger)
        # Keep what already runs running (and repaired) while the new spec waits for a fix; with a name
        # its children cannot carry, nothing can run.
        if exc.reason != "InvalidName":
            await _execute(ctx, body, isvc, spec, status, children, expect)
        schedule.after(None)
        return "invalid"

    observed = observe(children, isvc.name, spec, status, isvc.annotations, now)
    assert ctx.discovery is not None
    missing = await call(ctx.discovery.unavailable, asked_for(spec, ctx.plan_settings))
    if missing:
        observed = dataclasses.replace(observed, unavailable=tuple(OPTIONAL[kind] for kind in missing))
    sampler = memo_part(memo, "analysis", lambda: IntervalSampler(isvc.name))
    if sampler.due(spec.rollout.analysis, now):
        routers = router_metrics_urls(children.pods_with(component_labels(isvc.name, "router")))
        async with httpx.AsyncClient(trust_env=False) as client:
            sample = await sampler.take(client, routers, status=status, spec=spec.rollout.analysis, now=now)
        if sample is not None:
            observed = dataclasses.replace(observed, analysis=sample)
    if spec.rollout.parity is not None or "parity" in memo:  # the gate runs in the background, across passes
        report = poll_gate(
            memo_part(memo, "parity", GateRunner), None, spec, status, now,
            urls=lambda rev: [ctx.replica_url(isvc.namespace, isvc.name, rev)],
            load_suite=cluster_suite(spec.rollout.parity, isvc.namespace,  # type: ignore[arg-type]
                                     lambda *where: call(ctx.kube.get, *where)),
        )
        if report is not None:
            observed = dataclasses.replace(observed, parity=report)
    decision = advance(spec, isvc.generation, status, observed)
    if spec.autoscaling is not None and not spec.autoscaling.keda:
        meter = memo_part(memo, "load_meter", lambda: LoadMeter(isvc.name))
        scaled = await autoscale(meter, spec, decision.status, children, isvc.annotations, now)
        decision.status.autoscaling = scaled.status
        decision.events += [scaled.event] if scaled.event else []
        decision.requeue_after = min(x for x in (decision.requeue_after, scaled.requeue_after, interval(scaled)) if x)
    elif spec.autoscaling is not None:  # KEDA scales: say so rather than keep a stale decision
        decision.status.autoscaling = AutoscalingStatus(metric=spec.autoscaling.metric, keda=True,
                                                        reason="scaled by KEDA: a ScaledObject per revision")
    else:
        decision.status.autoscaling = None
    known = {(f.revision, f.at) for f in status.failed_revisions}
    for failed in decision.status.failed_revisions:
        if (failed.revision, failed.at) not in known:
            metrics.REVISIONS_FAILED.labels(namespace=isvc.namespace, isvc=isvc.name, reason=failed.reason).inc()
    await _execute(ctx, body, isvc, spec, decision.status, children, expect)
    await _write_status(ctx, isvc, decision.status)
    auto = decision.status.autoscaling
    scaled_up = auto is None or auto.keda or auto.desired_replicas > 0
    asked = SCALE_UP_ANNOTATION in isvc.annotations and scaled_up
    if decision.overrides_done or asked:  # acted on: remove the annotations so they are not acted on twice
        cleared = {f"{DOMAIN}/{name}": None for name in decision.overrides_done}
        if asked:
            cleared[SCALE_UP_ANNOTATION] = None
        await call(ctx.kube.merge_patch, API_VERSION, KIND, isvc.namespace, isvc.name,
                   {"metadata": {"annotations": cleared}})
    for event in decision.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        logger.log(logging.INFO if event.type == "Normal" else logging.WARNING, "%s: %s", event.reason, event.message)
    ended = datetime.now(timezone.utc)
    sampler.restart(spec.rollout.analysis, decision.status, ended)  # a canary's samples count from its traffic
    schedule.after(sampler.requeue(decision.requeue_after, decision.status, ended))
    return "ok"


class _Isvc:
    """The parts of a freshly read InferenceService that a pass uses."""

    def __init__(self, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        self.obj = obj
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.uid: str = meta.get("uid", "")
        self.annotations: dict[str, str] = dict(meta.get("annotations") or {})
        generation = meta.get("generation")
        self.generation = int(generation) if generation is not None else None
        self.status: dict[str, Any] = dict(obj.get("status") or {})


async def call(fn: Callable[..., T], *args: Any) -> T:
    """The Kubernetes client is synchronous: keep it off the event loop."""
    return await asyncio.to_thread(fn, *args)


async def _execute(ctx: Context, body: kopf.Body, isvc: _Isvc, spec: InferenceServiceSpec,
                   status: InferenceServiceStatus, children: Children, expect: Expectations) -> None:
    serving = plan(isvc.name, spec, status, Placement.cluster())
    wanted = objects(serving, Owner(isvc.name, isvc.namespace, isvc.uid), ctx.plan_settings)
    assert ctx.discovery is not None
    # children of a kind the cluster does not serve are left out (status says so), not applied every pass
    missing = set(await call(ctx.discovery.unavailable, [(o["apiVersion"], o["kind"]) for o in wanted]))
    if missing:
        wanted = [o for o in wanted if (o["apiVersion"], o["kind"]) not in missing]
    result = await call(apply_plan, ctx.kube, wanted, children, expect)
    for action, keys in (("created", result.created), ("deleted", result.deleted)):
        for _, kind, _ in keys:
            metrics.APPLIED.labels(kind=kind, action=action).inc()
        if keys:
            names = ", ".join(f"{kind}/{name}" for _, kind, name in keys)
            kopf.event(body, type="Normal", reason=action.capitalize(), message=f"{action} {names}")


async def _report_invalid(ctx: Context, body: kopf.Body, isvc: _Isvc, status: InferenceServiceStatus,
                          reason: str, message: str, now: datetime, logger: logging.Logger) -> None:
    """Degraded=True with the reason; one Event per distinct problem, not one per pass."""
    previous = status.condition("Degraded")
    await _write_status(ctx, isvc, invalid_spec(status, reason, message, generation=isvc.generation, now=now))
    if previous is None or previous.status != "True" or previous.message != message:
        kopf.event(body, type="Warning", reason=reason, message=message)
        logger.warning("%s: %s", reason, message)


async def _write_status(ctx: Context, isvc: _Isvc, new: InferenceServiceStatus) -> None:
    """Merge-patch only what changed; nothing at all when nothing did (no churn, no watch events)."""
    diff = merge_diff(isvc.status, new.to_wire())
    if diff:
        await call(ctx.kube.merge_patch, API_VERSION, KIND, isvc.namespace, isvc.name, {"status": diff}, "status")
