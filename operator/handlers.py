"""Thin kopf handlers: every trigger runs the same level-based reconcile.

    read the object -> observe the cluster (+ an analysis sample each interval) -> rollout.advance
    -> plan -> apply -> write status + Events

Create, resume, update and a periodic timer (drift repair and time-based rollout steps) all call
`reconcile`; deletion removes the children explicitly (owner references would too, eventually).
Handlers never sleep: a failure raises `kopf.TemporaryError` with a growing delay, and a spec
that cannot be planned is reported in status (Degraded=True, an Event) rather than retried.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeVar

import kopf
import pydantic

from folio.operator import metrics
from folio.operator.cluster_analysis import ClusterAnalysis
from folio.operator.engine_args import PlanningError
from folio.operator.executor import apply_plan, delete_all
from folio.operator.kube import ApiError, Kube
from folio.operator.merge import merge_diff
from folio.operator.observe import observe
from folio.operator.planner import PlanSettings, plan, validate
from folio.operator.rollout import advance
from folio.operator.spec import (
    API_VERSION,
    DOMAIN,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    InferenceServiceSpec,
    InferenceServiceStatus,
    check_name,
)
from folio.operator.status import set_condition

MAX_BACKOFF_S = 60.0  # API failures: 1, 2, 4 ... 60 s
UNEXPECTED_BACKOFF_S = 30.0
T = TypeVar("T")


@dataclass
class Context:
    """What every handler needs; kopf hands it over as `memo.ctx`."""

    kube: Kube
    plan_settings: PlanSettings = field(default_factory=PlanSettings)
    resync_s: float = 10.0


def configure(settings: kopf.OperatorSettings, *, watch_timeout_s: float = 300.0,
              peering: str | None = "folio", clusterwide: bool = False) -> kopf.OperatorSettings:
    """kopf settings: our own finalizer and storage names, quiet event posting, bounded watches."""
    settings.persistence.finalizer = f"{DOMAIN}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=DOMAIN)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=DOMAIN, key="last-handled-configuration"
    )
    # kopf's own log lines become Events only from WARNING up; ours are posted explicitly.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = watch_timeout_s
    settings.watching.client_timeout = watch_timeout_s + 30
    settings.watching.connect_timeout = 30
    settings.networking.request_timeout = 60
    # A deletion waits for a timer pass in flight to end before the finalizer goes: look again soon
    # (kopf's default is a minute).
    settings.background.cancellation_polling = 1.0
    # Namespaced operators must not list namespaces or watch CRDs cluster-wide: their Role has neither.
    settings.scanning.disabled = not clusterwide
    if peering:  # two operator replicas: one is active, the other waits (needs kopf's peering CRDs)
        settings.peering.name = peering
        settings.peering.mandatory = False
        settings.peering.clusterwide = clusterwide
    return settings


def register(registry: kopf.OperatorRegistry, resync_s: float) -> kopf.OperatorRegistry:
    """Attach the handlers. API failures back off via `kopf.TemporaryError`; anything unexpected is
    retried by kopf after `UNEXPECTED_BACKOFF_S`, so a bug never turns into a hot loop."""
    resource = (GROUP, VERSION, PLURAL)
    options: dict[str, Any] = {"registry": registry, "backoff": UNEXPECTED_BACKOFF_S}
    kopf.on.resume(*resource, **options)(on_change)
    kopf.on.create(*resource, **options)(on_change)
    kopf.on.update(*resource, **options)(on_change)
    kopf.on.delete(*resource, **options)(on_delete)
    kopf.timer(*resource, **options, interval=resync_s, initial_delay=resync_s)(on_timer)
    return registry


# ------------------------------------------------------------------------- handlers


async def on_change(body: kopf.Body, memo: kopf.Memo, retry: int, reason: str, logger: logging.Logger,
                    **_: Any) -> None:
    try:
        await reconcile(body, memo, trigger=str(reason), logger=logger)
    except ApiError as exc:
        raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=backoff(retry)) from exc


async def on_timer(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    # A failed periodic pass is simply tried again at the next tick.
    try:
        await reconcile(body, memo, trigger="timer", logger=logger)
    except ApiError as exc:
        logger.warning("periodic reconcile failed, next try in %ss: %s", memo.ctx.resync_s, exc)


async def on_delete(body: kopf.Body, memo: kopf.Memo, retry: int, logger: logging.Logger, **_: Any) -> None:
    ctx: Context = memo.ctx
    meta = body.meta
    try:
        async with _lock(memo):  # a periodic pass in flight must not re-create what goes now
            gone = await _call(delete_all, ctx.kube, meta.namespace, meta.name)
    except ApiError as exc:
        raise kopf.TemporaryError(f"deleting children: {exc}", delay=backoff(retry)) from exc
    for _, kind, _ in gone:
        metrics.APPLIED.labels(kind=kind, action="deleted").inc()
    logger.info("deleted %d child objects; the finalizer is released", len(gone))


def backoff(retry: int) -> float:
    return min(MAX_BACKOFF_S, 2.0 ** retry)


# ------------------------------------------------------------------------ reconcile


async def reconcile(body: kopf.Body, memo: kopf.Memo, *, trigger: str, logger: logging.Logger) -> None:
    ctx: Context = memo.ctx
    async with _lock(memo):
        started = time.monotonic()
        result = "error"
        try:
            result = await _reconcile(ctx, body, memo, logger)
        except ApiError as exc:
            metrics.ERRORS.labels(reason=f"api_{exc.status}").inc()
            raise
        finally:
            metrics.RECONCILES.labels(trigger=trigger, result=result).inc()
            metrics.DURATION.labels(trigger=trigger).observe(time.monotonic() - started)


async def _reconcile(ctx: Context, body: kopf.Body, memo: kopf.Memo, logger: logging.Logger) -> str:
    # Read the object afresh rather than trusting the event's body: status is the rollout's
    # memory, and the previous pass (maybe from another trigger) has just written it.
    obj = await _call(ctx.kube.get, API_VERSION, KIND, body.meta.namespace, body.meta.name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return "gone"
    isvc = _Isvc(obj)
    now = datetime.now(timezone.utc)
    status = InferenceServiceStatus.model_validate(isvc.status)
    try:
        spec = InferenceServiceSpec.model_validate(isvc.obj.get("spec") or {})
        try:
            check_name(isvc.name)
        except ValueError as exc:  # the API server took it, but Folio's children's names would not fit
            raise PlanningError("InvalidName", str(exc)) from None
        validate(spec)
    except pydantic.ValidationError as exc:
        await _report_invalid(ctx, body, isvc, status, "InvalidSpec", _explain(exc), now, logger)
        return "invalid"
    except PlanningError as exc:
        await _report_invalid(ctx, body, isvc, status, exc.reason, exc.message, now, logger)
        # Keep what already runs running (and repaired) while the new spec waits for a fix; with a name
        # its children cannot carry, nothing can run.
        if exc.reason != "InvalidName":
            await _apply(ctx, body, isvc, spec, status)
        return "invalid"

    observed = await _call(observe, ctx.kube, isvc.namespace, isvc.name, spec, status, isvc.annotations, now)
    analysis: ClusterAnalysis = memo.setdefault("analysis", ClusterAnalysis(isvc.name, isvc.namespace))
    sample = await analysis.sample(ctx.kube, spec, status)
    if sample is not None:
        observed = dataclasses.replace(observed, analysis=sample)
    decision = advance(spec, isvc.generation, status, observed)
    known = {(f.revision, f.at) for f in status.failed_revisions}
    for failed in decision.status.failed_revisions:
        if (failed.revision, failed.at) not in known:
            metrics.REVISIONS_FAILED.labels(namespace=isvc.namespace, isvc=isvc.name, reason=failed.reason).inc()
    await _apply(ctx, body, isvc, spec, decision.status)
    await _write_status(ctx, isvc, decision.status)
    if decision.overrides_done:  # acted on: remove the annotations so they are not acted on twice
        cleared = {f"{DOMAIN}/{name}": None for name in decision.overrides_done}
        await _call(ctx.kube.merge_patch, API_VERSION, KIND, isvc.namespace, isvc.name,
                    {"metadata": {"annotations": cleared}})
    for event in decision.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        logger.log(logging.INFO if event.type == "Normal" else logging.WARNING, "%s: %s", event.reason, event.message)
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


def _lock(memo: kopf.Memo) -> asyncio.Lock:
    """Timer and event handlers may overlap for one object; their passes must not interleave."""
    lock: asyncio.Lock = memo.setdefault("reconcile_lock", asyncio.Lock())
    return lock


async def _call(fn: Callable[..., T], *args: Any) -> T:
    """The Kubernetes client is synchronous: keep it off the event loop."""
    return await asyncio.to_thread(fn, *args)


async def _apply(ctx: Context, body: kopf.Body, isvc: _Isvc, spec: InferenceServiceSpec,
                 status: InferenceServiceStatus) -> None:
    meta = {"name": isvc.name, "namespace": isvc.namespace, "uid": isvc.uid}
    objects = plan(meta, spec, status, ctx.plan_settings)
    result = await _call(apply_plan, ctx.kube, isvc.namespace, isvc.name, objects)
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
    gen = isvc.generation
    conditions = set_condition(status.conditions, "Degraded", "True", reason, message, generation=gen, now=now)
    conditions = set_condition(conditions, "Progressing", "False", reason,
                               "the spec cannot be rolled out until it is fixed", generation=gen, now=now)
    await _write_status(ctx, isvc, status.model_copy(update={"conditions": conditions, "observed_generation": gen}))
    if previous is None or previous.status != "True" or previous.message != message:
        kopf.event(body, type="Warning", reason=reason, message=message)
        logger.warning("%s: %s", reason, message)


async def _write_status(ctx: Context, isvc: _Isvc, new: InferenceServiceStatus) -> None:
    """Merge-patch only what changed; nothing at all when nothing did (no churn, no watch events)."""
    diff = merge_diff(isvc.status, new.to_wire())
    if diff:
        await _call(ctx.kube.merge_patch, API_VERSION, KIND, isvc.namespace, isvc.name, {"status": diff}, "status")


def _explain(exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in ("spec", *err["loc"]))
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)
