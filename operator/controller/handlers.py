"""Thin kopf handlers: every trigger runs the same level-based `reconcile.reconcile`.

- create, resume and update (of the spec) reconcile at once, and so does a manual override
  (a `folio.dev/promote|abort|retry` annotation, which kopf does not count as an update);
- each InferenceService has a clock, a kopf daemon that reconciles when the last decision's
  ``requeue_after`` comes due (a step's pause ending, a drain ending, the next analysis
  interval), and at least every ``resync`` seconds, which repairs drift;
- indexes keep every child and pod labelled `managed-by=folio` in memory, from kopf's own watches,
  so that a pass never lists them, and an event on one pokes its owner's clock for a pass at once
  (a Job finished, a pod became ready);
- deletion removes the children explicitly (owner references would too, eventually);
- RolloutPolicies have an index and a clock of their own (`controller.fleet`): a service's pass reads
  there whether its new revision may start its canary.

Handlers never sleep: a failure raises `kopf.TemporaryError` with a growing delay, and the clock
waits on kopf's stop flag, so a deletion or shutdown never waits for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from folio.operator.controller import metrics
from folio.operator.controller.children import INDEXED_KINDS, Children, Expectations, index_child, index_id
from folio.operator.controller.cli import AUTO_PEERING, PEERING_LIFETIME_S
from folio.operator.controller.executor import delete_all
from folio.operator.controller.fleet import (
    POLICY_INDEX,
    SERVICE_INDEX,
    index_policy,
    index_service,
    on_policy_event,
    policy_clock,
    wake_policies,
)
from folio.operator.controller.heap import keep_heap_settled
from folio.operator.controller.observe import overrides
from folio.operator.controller.reconcile import Context, memo_part, reconcile
from folio.operator.controller.runtime import call
from folio.operator.k8s.client import ApiError
from folio.operator.k8s.names import ISVC_LABEL, MANAGED_BY, MANAGED_BY_LABEL, PLURALS, ROLLOUT_POLICY
from folio.operator.spec import DOMAIN, GROUP, PLURAL, SCALE_UP_ANNOTATION, VERSION

MAX_BACKOFF_S = 60.0  # API failures: 1, 2, 4 ... 60 s
UNEXPECTED_BACKOFF_S = 30.0
OWN_OBJECTS = f"{MANAGED_BY_LABEL}={MANAGED_BY}"  # the label selector of every child and pod the operator watches
# On deletion or shutdown the clock gets this long to finish a pass in flight before it is cancelled.
CLOCK_GRACE_S = 60.0


def configure(settings: kopf.OperatorSettings, *, watch_timeout_s: float = 300.0,
              peering: str | None = AUTO_PEERING, clusterwide: bool = False, peering_required: bool = False,
              peering_lifetime: int = PEERING_LIFETIME_S) -> kopf.OperatorSettings:
    """kopf settings: our own finalizer and storage names, quiet event posting, bounded watches, peering."""
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
    # A deletion waits for the clock's pass in flight to end before the finalizer goes: look again
    # soon (kopf's default is a minute).
    settings.background.cancellation_polling = 1.0
    # kopf gives a stopped daemon ten zero-time loop cycles to exit "instantly"; a clock that takes a few
    # more (its wait ending, a pass in flight finishing) would make the finalizer wait the whole
    # cancellation backoff (CLOCK_GRACE_S) for the next look. Wait for it a moment instead.
    settings.background.instant_exit_timeout = 2.0
    # Neither mode lists namespaces or watches CRDs cluster-wide (the chart grants neither): kopf takes
    # the namespaces as given, and a CRD installed after the start is handed to it by `watches.Watches`.
    settings.scanning.disabled = True
    # Children and pods are watched with a server-side label selector (the handlers' `labels=` filter is
    # kopf's own, after the API server has sent every object): in all-namespaces mode the operator's memory
    # and watch traffic follow the number of Folio's objects, not the cluster's. InferenceServices: all.
    for api_version, kind in INDEXED_KINDS:
        group, _, version = api_version.rpartition("/")
        settings.watching.label_selectors[group, version, PLURALS[(api_version, kind)]] = OWN_OBJECTS
    if peering:  # two operator replicas: one is active, the other waits (needs kopf's peering CRDs)
        settings.peering.name = peering
        # Required (a name was given): a replica starts paused and acts only once the peering object shows
        # no live peer above it, so a standby never acts between its start and its first look. Not
        # required, kopf starts unpaused and runs standalone where the peering CRD is not served.
        settings.peering.mandatory = peering_required
        settings.peering.clusterwide = clusterwide
        settings.peering.lifetime = peering_lifetime
    return settings


def register(registry: kopf.OperatorRegistry) -> kopf.OperatorRegistry:
    """Attach the handlers. API failures back off via `kopf.TemporaryError`; anything unexpected is
    retried by kopf after `UNEXPECTED_BACKOFF_S`, so a bug never turns into a hot loop. The longest a
    clock waits is the context's ``resync_s`` (`folio operator --resync-seconds`)."""
    for api_version, kind in INDEXED_KINDS:
        group, _, version = api_version.rpartition("/")
        child = {"group": group, "version": version, "plural": PLURALS[(api_version, kind)],
                 "labels": {MANAGED_BY_LABEL: MANAGED_BY}, "registry": registry}  # as OWN_OBJECTS, in kopf too
        kopf.index(**child, id=index_id(kind))(index_child)
        kopf.on.event(**child, id=f"{index_id(kind)}_changed")(on_child_event)
    resource = (GROUP, VERSION, PLURAL)
    options: dict[str, Any] = {"registry": registry, "backoff": UNEXPECTED_BACKOFF_S}
    kopf.on.resume(*resource, **options)(on_change)
    kopf.on.create(*resource, **options)(on_change)
    kopf.on.update(*resource, **options)(on_change)
    kopf.on.delete(*resource, **options)(on_delete)
    kopf.on.event(*resource, registry=registry)(on_service_event)
    kopf.daemon(*resource, **options, cancellation_backoff=CLOCK_GRACE_S, cancellation_timeout=10.0)(clock)
    policy = (GROUP, VERSION, PLURALS[ROLLOUT_POLICY])  # fleet rollouts (`controller.fleet`)
    kopf.index(*policy, registry=registry, id=POLICY_INDEX)(index_policy)
    kopf.index(*resource, registry=registry, id=SERVICE_INDEX)(index_service)
    kopf.on.event(*policy, registry=registry)(on_policy_event)
    kopf.daemon(*policy, **options, cancellation_backoff=CLOCK_GRACE_S, cancellation_timeout=10.0)(policy_clock)
    kopf.on.cleanup(registry=registry)(on_cleanup)
    return registry


async def start_heap_keeper(memo: kopf.Memo, **_: Any) -> None:
    """`folio operator`'s own process only (not an operator run inside a test's): see `controller.heap`."""
    memo["heap"] = asyncio.create_task(keep_heap_settled())


async def on_cleanup(memo: kopf.Memo, **_: Any) -> None:
    """The operator stops: its heap keeper (if started), and the HTTP client its passes shared."""
    heap: asyncio.Task[None] | None = memo.get("heap")
    if heap is not None:
        heap.cancel()
    ctx: Context | None = memo.get("ctx")
    if ctx is not None:
        await ctx.aclose()


async def on_change(body: kopf.Body, memo: kopf.Memo, retry: int, reason: str, logger: logging.Logger,
                    **kwargs: Any) -> None:
    try:
        await reconcile(body, memo, trigger=str(reason), logger=logger, indexes=kwargs)
    except ApiError as exc:
        raise kopf.TemporaryError(f"Kubernetes API: {exc}", delay=backoff(retry)) from exc


async def on_service_event(namespace: str | None, name: str | None, meta: kopf.Meta, memo: kopf.Memo,
                           **_: Any) -> None:
    """A manual override or a router's scale up asked for (an annotation): a pass now, not at the resync.
    Any change of a service (its status above all) is news to the RolloutPolicies of its namespace."""
    wake_policies(memo.ctx, namespace or "")
    schedule = memo.ctx.schedules.get((namespace or "", name or ""))
    if schedule is not None and (overrides(meta.annotations) or SCALE_UP_ANNOTATION in meta.annotations):
        schedule.poke()


async def on_child_event(namespace: str | None, labels: Mapping[str, str], memo: kopf.Memo, **_: Any) -> None:
    """Runs after the index holds the event: the owner's next pass sees it."""
    ctx: Context = memo.ctx
    schedule = ctx.schedules.get((namespace or "", labels.get(ISVC_LABEL, "")))
    if schedule is not None:
        schedule.poke()


async def clock(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: logging.Logger,
                **kwargs: Any) -> None:
    """The InferenceService's clock: a pass when a child changed or the last decision is due again,
    else every resync."""
    ctx: Context = memo.ctx
    schedule = ctx.schedule(body.meta.namespace, body.meta.name)
    while not stopped:
        schedule.wake.clear()
        delay, trigger = schedule.next_pass(ctx.resync_s)
        if await _woken(schedule.wake, stopped, delay) or stopped:
            continue  # another pass just set a new due time (or we are asked to stop): look again
        try:
            await reconcile(body, memo, trigger=trigger, logger=logger, indexes=kwargs)
        except ApiError as exc:  # a failed pass is simply tried again at the next one
            logger.warning("periodic reconcile failed, next try in %ss: %s", ctx.resync_s, exc)
            schedule.after(None)


async def _woken(wake: asyncio.Event, stopped: kopf.DaemonStopped, delay: float) -> bool:
    """Wait ``delay`` seconds; True when ``wake`` or ``stopped`` cut the wait short."""
    waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        done, _ = await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
    return bool(done)


async def on_delete(body: kopf.Body, memo: kopf.Memo, retry: int, logger: logging.Logger, **kwargs: Any) -> None:
    meta = body.meta
    expect = memo_part(memo, "expectations", Expectations)
    live = expect.view(Children.from_indexes(kwargs, meta.namespace, meta.name))
    try:
        async with memo_part(memo, "reconcile_lock", asyncio.Lock):  # a pass in flight must not re-create what goes now
            gone = await call(delete_all, memo.ctx.kube, live, expect)
    except ApiError as exc:
        raise kopf.TemporaryError(f"deleting children: {exc}", delay=backoff(retry)) from exc
    for _, kind, _ in gone:
        metrics.APPLIED.labels(kind=kind, action="deleted").inc()
    memo.ctx.schedules.pop((meta.namespace, meta.name), None)
    metrics.forget_isvc(meta.namespace or "", meta.name or "")
    logger.info("deleted %d child objects; the finalizer is released", len(gone))


def backoff(retry: int) -> float:
    return min(MAX_BACKOFF_S, 2.0 ** retry)
