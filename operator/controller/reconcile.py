"""The operator's entry to a reconcile pass: every kopf trigger of an InferenceService runs this one.

    read the object -> its children (indexes) -> `folio.operator.reconcile.run_pass` on the cluster's
    runtime (`controller.runtime.ClusterRuntime`) -> the InferenceService's clock set for the next pass

Passes of one InferenceService never interleave (a lock in its memo); what a pass keeps for the next
(the analysis sampler, the parity gate in flight, the autoscaler's counters) lives in the memo too.
API failures are raised for the handler to back off.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import kopf

from folio.operator.controller import metrics
from folio.operator.controller.children import Children, Expectations
from folio.operator.controller.discovery import Discovery
from folio.operator.controller.fleet import policies_in
from folio.operator.controller.runtime import ClusterRuntime, Isvc, call
from folio.operator.controller.watches import Watches
from folio.operator.k8s.client import ApiError, Kube
from folio.operator.k8s.names import engine_service_url, pod_engine_url
from folio.operator.reconcile import Memory, Target, run_pass
from folio.operator.serving.objects import PlanSettings
from folio.operator.serving.validate import CLUSTER, Site
from folio.operator.spec import API_VERSION, KIND, InferenceServiceStatus

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


@dataclass
class Context:
    """What every handler needs; kopf hands it over as `memo.ctx` (one for the whole operator)."""

    kube: Kube
    plan_settings: PlanSettings = field(default_factory=PlanSettings)
    resync_s: float = 10.0
    # Every InferenceService's schedule, so that an event on a child can poke its owner's clock.
    schedules: dict[tuple[str, str], Schedule] = field(default_factory=dict)
    # (namespace, isvc, revision) -> a replica's base URL, for the parity gate: the revision's Service
    replica_url: Callable[[str, str, str], str] = field(default=engine_service_url)
    # an engine pod -> its API base URL, where adapters are loaded (tests point it at fake engines)
    engine_url: Callable[[dict[str, Any]], str] = field(default=pod_engine_url)
    # which optional kinds (CRDs that may be absent) the cluster serves; made from `kube` when not given
    discovery: Discovery | None = None
    # which resources kopf watches: a kind whose CRD came after the start is handed to kopf to watch
    # (None: only what kopf found at its start is watched)
    watches: Watches | None = None
    # the validation rules of where specs run: a cluster's, with fault injection allowed by
    # `folio operator --allow-fault-injection` (`dataclasses.replace(CLUSTER, fault_injection=True)`)
    site: Site = CLUSTER
    # each RolloutPolicy's clock wake-up (`controller.fleet`), set when a service of its namespace changes
    policy_wakes: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    # one HTTP client for every pass's scrapes and parity gates: a client per pass costs a TLS context
    # (~40 ms of CPU), which at hundreds of services was most of an idle operator's work
    _http: httpx.AsyncClient | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.discovery is None:
            self.discovery = Discovery(self.kube)

    @property
    def http(self) -> httpx.AsyncClient:
        """Made on first use, inside kopf's event loop; closed by `aclose` at the operator's cleanup."""
        if self._http is None:
            self._http = httpx.AsyncClient(trust_env=False)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


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


def _known(body: kopf.Body, memo: kopf.Memo) -> dict[str, Any] | None:
    """The object as kopf's watch last delivered it, when that is the version the previous pass left.

    kopf keeps one body per object, replaced by every watch event before any handler runs. When its
    resourceVersion is the one the previous pass read or wrote, nothing has changed since that kopf has
    not been told of, and status (the rollout's memory) is the previous pass's own: no need to read it
    again. That makes an idle clock's pass free of API requests (issue 44: watches, not polling); a
    change anyone else makes arrives as an event (a spec change, an override annotation) and is read.
    """
    version = body.metadata.get("resourceVersion")
    if version is None or memo.get("seen_version") != version:
        return None
    return copy.deepcopy(dict(body))


async def _pass(ctx: Context, body: kopf.Body, memo: kopf.Memo, logger: logging.Logger,
                indexes: Mapping[str, Any]) -> str:
    # Read the object afresh unless the watch has delivered what the previous pass left (`_known`):
    # status is the rollout's memory, and the previous pass (maybe from another trigger) has just written it.
    obj = _known(body, memo)
    if obj is None:
        obj = await call(ctx.kube.get, API_VERSION, KIND, body.meta.namespace, body.meta.name)
    if obj is None or obj["metadata"].get("deletionTimestamp"):
        memo.pop("seen_version", None)
        return "gone"
    isvc = Isvc(obj)
    schedule = ctx.schedule(isvc.namespace, isvc.name)
    schedule.poked = False  # this pass sees every change so far
    expect = memo_part(memo, "expectations", Expectations)
    children = expect.view(Children.from_indexes(indexes, isvc.namespace, isvc.name))
    assert ctx.discovery is not None
    runtime = ClusterRuntime(ctx.kube, isvc, children, expect, ctx.plan_settings, ctx.discovery, ctx.replica_url,
                             body, logger, site=ctx.site, watches=ctx.watches, http=ctx.http,
                             engine_url=ctx.engine_url, policies=policies_in(indexes, isvc.namespace))
    target = Target(isvc.name, isvc.obj.get("spec") or {}, isvc.generation,
                    InferenceServiceStatus.model_validate(isvc.status))
    memo["seen_version"] = None  # until the pass has ended: a failed one leaves the next to read afresh
    outcome = await run_pass(runtime, memo_part(memo, "pass", lambda: Memory(isvc.name)), target)
    memo["seen_version"] = runtime.written_version or isvc.meta.get("resourceVersion")
    schedule.after(outcome.decision.requeue_after)
    return "invalid" if outcome.problems else "ok"
