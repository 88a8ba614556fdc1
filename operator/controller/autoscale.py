"""The operator's autoscaling step: read the load, `autoscaling.decide`, put the decision in status.

Runs in every reconcile pass of an InferenceService with ``spec.autoscaling`` (and without
``keda: true``, where KEDA's ScaledObject decides instead), after the rollout's `advance`, so the
serving plan that follows takes its replica counts from the new ``status.autoscaling``. The load
comes from every router pod's `/metrics` (in flight, held, requests counted) and, for Waiting and
KVCache, from every ready engine pod's; ready and starting replicas from the engine pods the
indexes hold. A pass asks to run again every `INTERVAL_S` while autoscaling is on, and every
`AT_ZERO_S` while the service is at zero replicas: then a router holding requests is waiting for
this look (its held-requests gauge is its ask for a scale up; routers hold no write permission on
the API, so they cannot annotate their InferenceService themselves). The `folio.dev/scale-up`
annotation, set by anyone who may patch the InferenceService, wakes it at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime

import httpx

from folio.operator.autoscaling.decide import Decision, decide
from folio.operator.autoscaling.load import LoadMeter
from folio.operator.controller.children import Children, Obj
from folio.operator.controller.observe import ready_replicas, router_metrics_urls
from folio.operator.k8s.names import ENGINE_PORT, component_labels, engine_name
from folio.operator.serving.plan import RUNNING_ROLES
from folio.operator.spec import SCALE_UP_ANNOTATION, InferenceServiceSpec, InferenceServiceStatus

INTERVAL_S = 5.0
AT_ZERO_S = 1.0  # one scrape of the routers' /metrics per second per service at zero
SCRAPE_TIMEOUT_S = 3.0


async def autoscale(meter: LoadMeter, spec: InferenceServiceSpec, status: InferenceServiceStatus,
                    children: Children, annotations: Mapping[str, str], now: datetime) -> Decision:
    auto = spec.autoscaling
    assert auto is not None
    isvc = meter.isvc
    ready, starting, ready_pods = engine_pods(children, isvc, status)
    routers = router_metrics_urls(children.pods_with(component_labels(isvc, "router")))
    engines = engine_metrics_urls(ready_pods) if auto.metric != "InFlight" else []
    async with httpx.AsyncClient(trust_env=False, timeout=SCRAPE_TIMEOUT_S) as client:
        router_texts, engine_texts = await asyncio.gather(scrape(client, routers), scrape(client, engines))
    load = meter.load(auto, now, router_texts, engine_texts, ready=ready, starting=starting,
                      asked=SCALE_UP_ANNOTATION in annotations)
    previous = status.autoscaling if status.autoscaling is not None and not status.autoscaling.keda else None
    return decide(auto, previous, load)


def interval(decision: Decision) -> float:
    """Seconds until the next look: sooner at zero, where held requests wait for it."""
    return AT_ZERO_S if decision.status.desired_replicas == 0 else INTERVAL_S


def engine_pods(children: Children, isvc: str, status: InferenceServiceStatus) -> tuple[int, int, list[Obj]]:
    """Of the running revisions' engines: ready replicas, replicas asked for and not ready yet (Pending,
    pulling the image, loading weights), and the ready pods (whose metrics Waiting and KVCache read)."""
    ready = starting = 0
    pods: list[Obj] = []
    for rev in status.revisions:
        if rev.role not in RUNNING_ROLES:
            continue
        deployment = children.get("apps/v1", "Deployment", engine_name(isvc, rev.name))
        if deployment is None:
            continue
        up = ready_replicas(deployment)
        ready += up
        starting += max(0, int((deployment.get("spec") or {}).get("replicas") or 0) - up)
        pods += [p for p in children.pods_with(component_labels(isvc, "engine", rev.name)) if pod_ready(p)]
    return ready, starting, pods


def pod_ready(pod: Obj) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def engine_metrics_urls(pods: Sequence[Obj]) -> list[str]:
    urls = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if ip:
            host = f"[{ip}]" if ":" in ip else ip
            urls.append(f"http://{host}:{ENGINE_PORT}/metrics")
    return sorted(urls)


async def scrape(client: httpx.AsyncClient, urls: Sequence[str]) -> dict[str, str]:
    """``{url: text}`` of the ones that answered; one that does not is left out of this look."""

    async def one(url: str) -> tuple[str, str | None]:
        try:
            resp = await client.get(url)
            resp.raise_for_status()
            return url, resp.text
        except httpx.HTTPError:
            return url, None

    found = await asyncio.gather(*(one(u) for u in urls))
    return {url: text for url, text in found if text is not None}
