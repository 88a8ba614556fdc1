"""The cluster as a pass's runtime: children from kopf's indexes in, objects and status out.

Made afresh for every pass from the InferenceService just read and its children as the indexes hold
them (`Children`, corrected by this operator's own recent writes: `Expectations`). `execute` applies the
plan's objects (server-side apply, only what differs), writes the status diff, clears the override
annotations it acted on and posts the Events; API failures propagate for the handler to back off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial
from typing import Any, ClassVar, Literal, TypeVar

import httpx
import kopf

from folio.operator.controller import metrics
from folio.operator.controller.children import Children, Expectations
from folio.operator.controller.discovery import OPTIONAL, Discovery, asked_for
from folio.operator.controller.executor import apply_plan
from folio.operator.controller.observe import (
    engine_capacity,
    engine_pods,
    gate_patch,
    gated,
    observe,
    prepull_weights,
    router_metrics_urls,
)
from folio.operator.controller.watches import Watches
from folio.operator.fleet.gate import PolicyRef, hold
from folio.operator.k8s.client import ApiError, Kube, path
from folio.operator.k8s.merge_patch import merge_diff
from folio.operator.k8s.names import SCALED_OBJECT, component_labels, override_annotation, pod_engine_url
from folio.operator.parity import SuitePrompt, cluster_suite
from folio.operator.reconcile import Capacity
from folio.operator.rollout import Decision, Observed
from folio.operator.router.secrets import decode_secret
from folio.operator.router.tenants import INVALID_ACCESS, access_unavailable
from folio.operator.serving.objects import Owner, PlanSettings, objects
from folio.operator.serving.plan import Placement, ServingPlan
from folio.operator.serving.validate import CLUSTER, Site
from folio.operator.spec import (
    API_VERSION,
    KIND,
    SCALE_UP_ANNOTATION,
    InferenceServiceSpec,
    InferenceServiceStatus,
    ParitySpec,
    now_iso,
    revision_name,
)

T = TypeVar("T")


async def call(fn: Callable[..., T], *args: Any) -> T:
    """The Kubernetes client is synchronous: keep it off the event loop."""
    return await asyncio.to_thread(fn, *args)


@dataclass
class Isvc:
    """The parts of a freshly read InferenceService that a pass uses."""

    obj: dict[str, Any]

    @property
    def meta(self) -> dict[str, Any]:
        return self.obj["metadata"]

    @property
    def name(self) -> str:
        return str(self.meta["name"])

    @property
    def namespace(self) -> str:
        return str(self.meta["namespace"])

    @property
    def annotations(self) -> dict[str, str]:
        return dict(self.meta.get("annotations") or {})

    @property
    def generation(self) -> int | None:
        generation = self.meta.get("generation")
        return int(generation) if generation is not None else None

    @property
    def status(self) -> dict[str, Any]:
        return dict(self.obj.get("status") or {})


@dataclass
class ClusterRuntime:
    """One pass's view of the cluster (`folio.operator.reconcile.Runtime`)."""

    placement: ClassVar[Placement] = Placement.cluster()

    kube: Kube
    isvc: Isvc
    children: Children
    expect: Expectations
    settings: PlanSettings
    discovery: Discovery
    replica_url: Callable[[str, str, str], str]  # (namespace, isvc, revision) -> a base URL
    body: kopf.Body
    logger: logging.Logger
    site: Site = CLUSTER  # the operator's (`Context.site`): `--allow-fault-injection` changes it
    watches: Watches | None = None  # kopf's watched resources (`Context.watches`)
    # the operator's HTTP client (`Context.http`), which outlives every pass and parity gate
    # (None: each pass opens its own, and a gate its own)
    http: httpx.AsyncClient | None = None
    # the optional kinds asked for that the cluster does not serve (set by `observe`)
    missing: tuple[tuple[str, str], ...] = ()
    # the InferenceService's resourceVersion after this pass's own writes (None: it wrote nothing)
    written_version: str | None = None
    engine_url: Callable[[dict[str, Any]], str] = pod_engine_url  # an engine pod's API base URL (`Context.engine_url`)
    policies: Sequence[PolicyRef] = ()  # the RolloutPolicies of its namespace (the index's): the fleet gate

    @property
    def keda(self) -> bool:
        """KEDA scales when the spec asks for it, unless its CRD is absent: then Folio's own autoscaler does."""
        return SCALED_OBJECT not in self.missing

    # ------------------------------------------------------------------ observing

    async def observe(self, spec: InferenceServiceSpec, status: InferenceServiceStatus, now: datetime) -> Observed:
        observed = observe(self.children, self.isvc.name, spec, status, self.isvc.annotations, now)
        held = hold(self.policies, self.isvc.name, self.isvc.meta.get("labels") or {}, revision_name(spec))
        if held is not None:
            observed = replace(observed, waiting=held.message)
        asked = asked_for(spec, self.settings)
        missing = await call(self.discovery.unavailable, asked)
        self.missing = tuple(missing)
        if self.watches is not None:  # a CRD installed after the start: kopf watches the kind from now on
            await self.watches.ensure([kind for kind in asked if kind not in missing], self.logger)
        unavailable = [OPTIONAL[kind] for kind in missing]
        access = await self._access(spec)
        if access is not None:
            unavailable.append(access)
        if not unavailable:
            return observed
        return Observed(observed.now, observed.revisions, overrides=observed.overrides,
                        unavailable=tuple(unavailable), waiting=observed.waiting)

    async def _access(self, spec: InferenceServiceSpec) -> tuple[str, str] | None:
        """What spec.access's Secret of API keys leaves wrong (read by name; its keys are never kept)."""
        ref = spec.access.api_keys_secret_ref if spec.access is not None else None
        if ref is None:
            return None
        try:
            secret = await call(self.kube.get, "v1", "Secret", self.isvc.namespace, ref.name)
        except ApiError as exc:
            return INVALID_ACCESS, f"spec.access: cannot read the API keys' Secret {ref.name!r}: {exc}"
        return access_unavailable(spec.access, decode_secret(secret) if secret is not None else None)

    def router_metrics(self) -> list[str]:
        return router_metrics_urls(self.children.pods_with(component_labels(self.isvc.name, "router")))

    def capacity(self, status: InferenceServiceStatus) -> Capacity:
        ready, starting, metrics_urls = engine_capacity(self.children, self.isvc.name, status)
        return Capacity(ready, starting, metrics_urls, asked=SCALE_UP_ANNOTATION in self.isvc.annotations)

    def adapter_weights(self, revision: str) -> tuple[Literal["pending", "ready", "failed"], str]:
        return prepull_weights(self.children, self.isvc.name, revision)

    def engines(self, revision: str) -> Sequence[str]:
        return [self.engine_url(p) for p in engine_pods(self.children, self.isvc.name, revision)]

    async def mark_engines(self, holding: Mapping[str, bool]) -> None:
        """The pods' `ADAPTERS_GATE` condition, where it is not what ``holding`` says (a JSON patch guarded by a
        test of the condition's place: a pod that changed meanwhile is left to the next pass)."""
        now = now_iso(datetime.now(timezone.utc))
        for pod in engine_pods(self.children, self.isvc.name):
            url = self.engine_url(pod)
            if url not in holding or not gated(pod):
                continue
            ops = gate_patch(pod, holding[url], now)
            if not ops:
                continue
            where = path("v1", "Pod", self.isvc.namespace, pod["metadata"]["name"]) + "/status"
            try:
                await call(partial(self.kube.call, "PATCH", where, body=ops, content_type="application/json-patch+json"))
            except ApiError as exc:
                self.logger.info("adapters gate of pod %s not set (%s): next pass", pod["metadata"]["name"], exc)

    def replica_urls(self, revision: str) -> Sequence[str]:
        return [self.replica_url(self.isvc.namespace, self.isvc.name, revision)]

    def suite(self, gate: ParitySpec) -> Callable[[], Awaitable[list[SuitePrompt]]]:
        return cluster_suite(gate, self.isvc.namespace, lambda *where: call(self.kube.get, *where))

    def endpoints(self) -> Mapping[str, Sequence[str]]:
        return {}  # the routers watch their revisions' EndpointSlices

    # ------------------------------------------------------------------ acting

    async def execute(self, serving: ServingPlan | None, decision: Decision) -> None:
        if serving is not None:
            await self._apply(serving)
        self._count_failures(decision.status)
        await self._write_status(decision.status)
        await self._clear_annotations(decision)
        for event in decision.events:
            kopf.event(self.body, type=event.type, reason=event.reason, message=event.message)
            level = logging.INFO if event.type == "Normal" else logging.WARNING
            self.logger.log(level, "%s: %s", event.reason, event.message)

    async def _apply(self, serving: ServingPlan) -> None:
        isvc = self.isvc
        auto = serving.spec.autoscaling
        if auto is not None and auto.keda and await call(self.discovery.unavailable, [SCALED_OBJECT]):
            # no KEDA: the Deployments keep the replicas Folio's own autoscaler gives them
            serving = replace(serving, spec=serving.spec.model_copy(
                update={"autoscaling": auto.model_copy(update={"keda": False})}))
        wanted = objects(serving, Owner(isvc.name, isvc.namespace, str(isvc.meta.get("uid", ""))), self.settings)
        # children of a kind the cluster does not serve are left out (status says so), not applied every pass
        missing = set(await call(self.discovery.unavailable, [(o["apiVersion"], o["kind"]) for o in wanted]))
        if missing:
            wanted = [o for o in wanted if (o["apiVersion"], o["kind"]) not in missing]
        result = await call(apply_plan, self.kube, wanted, self.children, self.expect)
        for action, keys in (("created", result.created), ("deleted", result.deleted)):
            for _, kind, _ in keys:
                metrics.APPLIED.labels(kind=kind, action=action).inc()
            if keys:
                names = ", ".join(f"{kind}/{name}" for _, kind, name in keys)
                kopf.event(self.body, type="Normal", reason=action.capitalize(), message=f"{action} {names}")

    def _count_failures(self, new: InferenceServiceStatus) -> None:
        known = {(f.get("revision"), f.get("at")) for f in self.isvc.status.get("failedRevisions") or []}
        for failed in new.failed_revisions:
            if (failed.revision, failed.at) not in known:
                metrics.REVISIONS_FAILED.labels(namespace=self.isvc.namespace, isvc=self.isvc.name,
                                                reason=failed.reason).inc()

    async def _write_status(self, new: InferenceServiceStatus) -> None:
        """Merge-patch only what changed; nothing at all when nothing did (no churn, no watch events)."""
        diff = merge_diff(self.isvc.status, new.to_wire())
        if diff:
            self._wrote(await call(self.kube.merge_patch, API_VERSION, KIND, self.isvc.namespace, self.isvc.name,
                                   {"status": diff}, "status"))

    async def _clear_annotations(self, decision: Decision) -> None:
        """Overrides acted on, and a scale up once it is under way, are removed so they are not acted on twice."""
        cleared: dict[str, None] = {override_annotation(name): None for name in decision.overrides_done}
        auto = decision.status.autoscaling
        scaled_up = auto is None or auto.keda or auto.desired_replicas > 0
        if SCALE_UP_ANNOTATION in self.isvc.annotations and scaled_up:
            cleared[SCALE_UP_ANNOTATION] = None
        if cleared:
            self._wrote(await call(self.kube.merge_patch, API_VERSION, KIND, self.isvc.namespace, self.isvc.name,
                                   {"metadata": {"annotations": cleared}}))

    def _wrote(self, written: dict[str, Any] | None) -> None:
        version = ((written or {}).get("metadata") or {}).get("resourceVersion")
        self.written_version = str(version) if version is not None else None
