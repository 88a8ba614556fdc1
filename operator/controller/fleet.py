"""Thin kopf handlers of RolloutPolicies (`folio.operator.fleet`): each policy's clock runs its pure state
machine on the statuses of its namespace's InferenceServices and writes the policy's status.

- an index holds every policy (its selector and last status) by namespace: an InferenceService's pass reads
  there whether a RolloutPolicy holds its new revision (`fleet.gate.hold`), with no API request;
- another index holds what a policy reads of every InferenceService (`ServiceView`: labels, spec revision,
  stable, canary, failed revisions), from kopf's own watch;
- each policy has a clock (a kopf daemon) that passes at least every resync, soon when an InferenceService
  of its namespace changes (`wake_policies`, from the services' event handler, which runs after the index
  holds the change) and when a soak ends. A pass reads the policy afresh (status is the policy's memory: a
  restart or a failover carries on from it), takes the services and policies from the indexes, decides,
  and writes the status diff;
- an event on a policy (its status written, its selector changed, the policy deleted) runs after the index
  holds it and pokes the services it names, so an admitted canary starts and a released service goes on
  at once.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import kopf
from pydantic import ValidationError

from folio.operator.controller import metrics
from folio.operator.controller.runtime import call
from folio.operator.fleet.gate import PolicyRef
from folio.operator.fleet.model import (
    POLICY_KIND,
    RESUME_ANNOTATION,
    LabelSelector,
    RolloutPolicySpec,
    RolloutPolicyStatus,
)
from folio.operator.fleet.policy import Failure, ServiceView, decide, set_condition
from folio.operator.k8s.client import ApiError
from folio.operator.k8s.merge_patch import merge_diff
from folio.operator.spec import API_VERSION, InferenceServiceSpec, InferenceServiceStatus, revision_name

if TYPE_CHECKING:
    from folio.operator.controller.reconcile import Context

POLICY_INDEX = "rollout_policies"  # kopf index: namespace -> PolicyRef of each policy there
SERVICE_INDEX = "fleet_services"  # kopf index: namespace -> ServiceView of each InferenceService there
MIN_PASS_GAP_S = 0.5  # a policy's passes are at least this far apart


def index_policy(namespace: str | None, name: str | None, spec: Mapping[str, Any], status: Mapping[str, Any],
                 **_: Any) -> dict[str, PolicyRef]:
    try:
        selector = RolloutPolicySpec.model_validate(dict(spec)).selector
        st = RolloutPolicyStatus.model_validate(dict(status or {}))
    except ValidationError:
        return {}  # an invalid policy governs nothing (its own status says why)
    return {namespace or "": PolicyRef(name or "", selector, st)}


def policies_in(indexes: Mapping[str, Any], namespace: str) -> list[PolicyRef]:
    """The RolloutPolicies of ``namespace`` as the index holds them (none where the CRD is not served)."""
    index = indexes.get(POLICY_INDEX)
    return list(index.get(namespace, ())) if index is not None else []


def index_service(namespace: str | None, body: kopf.Body, **_: Any) -> dict[str, ServiceView]:
    """What a policy reads of each InferenceService, kept from kopf's own watch: a policy's pass lists none."""
    if body.metadata.get("deletionTimestamp"):
        return {}
    return {namespace or "": service_view(body, {})}


def service_view(obj: Mapping[str, Any], selectors: Mapping[str, LabelSelector]) -> ServiceView:
    """What the policy reads of one InferenceService: labels, spec revision, stable, canary, failures."""
    meta = obj.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    try:
        target: str | None = revision_name(InferenceServiceSpec.model_validate(obj.get("spec") or {}))
    except ValidationError:
        target = None
    try:
        st = InferenceServiceStatus.model_validate(obj.get("status") or {})
    except ValidationError:
        st = InferenceServiceStatus()
    failed = tuple(Failure(f.revision, f.reason, f.at, f.message) for f in st.failed_revisions)
    policies = frozenset(n for n, sel in selectors.items() if sel.matches(labels))
    return ServiceView(str(meta.get("name", "")), labels, target, st.stable_revision, st.canary_revision, failed,
                       policies)


async def reconcile_policy(ctx: Context, namespace: str, name: str, body: kopf.Body,
                           logger: logging.Logger | logging.LoggerAdapter, indexes: Mapping[str, Any]) -> float | None:
    """One pass of a policy; seconds until a soak ends (None: nothing is due but a change). The policy is read
    afresh (its status is its memory); the services and the other policies come from the indexes."""
    obj = await call(ctx.kube.get, API_VERSION, POLICY_KIND, namespace, name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        return None
    now = datetime.now(timezone.utc)
    generation = obj["metadata"].get("generation")
    old = copy.deepcopy(obj.get("status") or {})
    try:
        spec = RolloutPolicySpec.model_validate(obj.get("spec") or {})
    except ValidationError as exc:
        status = RolloutPolicyStatus.model_validate(old)
        status.conditions = set_condition(status.conditions, "Ready", "False", "InvalidSpec",
                                          f"the spec cannot be read: {exc.errors()[0].get('msg', exc)}",
                                          generation=generation, now=now)
        await _write(ctx, namespace, name, old, status)
        return None
    selectors = {p.name: p.selector for p in policies_in(indexes, namespace)}
    selectors[name] = spec.selector  # as just read
    services = indexes.get(SERVICE_INDEX)
    views = [replace(v, policies=frozenset(n for n, sel in selectors.items() if sel.matches(dict(v.labels))))
             for v in (services.get(namespace, ()) if services is not None else ())]
    resume = (obj["metadata"].get("annotations") or {}).get(RESUME_ANNOTATION)
    d = decide(name, spec, generation, RolloutPolicyStatus.model_validate(old), views, now, resume=resume)
    await _write(ctx, namespace, name, old, d.status)
    for event in d.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        logger.log(logging.INFO if event.type == "Normal" else logging.WARNING, "%s: %s", event.reason, event.message)
    phases: dict[str, int] = {}
    for row in d.status.services:
        phases[row.phase] = phases.get(row.phase, 0) + 1
    halted = d.status.condition("Halted")
    metrics.set_policy(namespace, name, phases, halted is not None and halted.status == "True")
    return d.requeue_after


async def _write(ctx: Context, namespace: str, name: str, old: dict[str, Any], status: RolloutPolicyStatus) -> None:
    diff = merge_diff(old, status.to_wire())
    if diff:
        await call(ctx.kube.merge_patch, API_VERSION, POLICY_KIND, namespace, name, {"status": diff}, "status")


async def policy_clock(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: logging.Logger,
                       **kwargs: Any) -> None:
    """The policy's clock: a pass when a service of its namespace changed, a soak ends, or at the resync."""
    ctx: Context = memo.ctx
    namespace, name = body.meta.namespace or "", body.meta.name or ""
    wake = ctx.policy_wakes.setdefault((namespace, name), asyncio.Event())
    try:
        while not stopped:
            wake.clear()
            delay = ctx.resync_s
            try:
                due = await reconcile_policy(ctx, namespace, name, body, logger, kwargs)
                delay = min(delay, due) if due is not None else delay
            except ApiError as exc:  # tried again at the next pass
                logger.warning("RolloutPolicy pass failed, next try in %ss: %s", delay, exc)
            await asyncio.sleep(MIN_PASS_GAP_S)  # a burst of service events makes one pass, not one each
            await _wait(wake, stopped, max(0.0, delay - MIN_PASS_GAP_S))
    finally:
        ctx.policy_wakes.pop((namespace, name), None)
        metrics.forget_policy(namespace, name)


async def _wait(wake: asyncio.Event, stopped: kopf.DaemonStopped, delay: float) -> None:
    waits = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()


def wake_policies(ctx: Context, namespace: str) -> None:
    """An InferenceService of ``namespace`` changed: every policy there looks again now."""
    for (ns, _), wake in ctx.policy_wakes.items():
        if ns == namespace:
            wake.set()


async def on_policy_event(namespace: str | None, name: str | None, status: Mapping[str, Any], type: str | None,
                          memo: kopf.Memo, **_: Any) -> None:
    """Runs after the index holds the event: the services the policy lets start pass now (an admitted one starts
    its canary); when the policy goes, every service it governed (each is released). A service that left the
    selector goes on at its next pass (the index no longer names it). The policy's own clock looks again too
    (a resume annotation, a spec change)."""
    ctx: Context = memo.ctx
    wake = ctx.policy_wakes.get((namespace or "", name or ""))
    if wake is not None:
        wake.set()
    rows: Iterable[Mapping[str, Any]] = (status or {}).get("services") or []
    for row in rows:
        if type == "DELETED" or row.get("phase") == "Admitted":
            schedule = ctx.schedules.get((namespace or "", str(row.get("name", ""))))
            if schedule is not None:
                schedule.poke()
