"""The pass's autoscaling step: read the load, `autoscaling.decide`, put the decision in status.

Runs after the rollout's `advance`, so the serving plan that follows takes its replica counts from the
new ``status.autoscaling``. The load comes from every router's `/metrics` (in flight, held, requests
counted) and, for Waiting and KVCache, from every ready engine's; ready and starting replicas from the
runtime (`Runtime.capacity`). With ``keda: true`` where KEDA runs (a cluster), KEDA's ScaledObject
decides and status says so; `folio up` has no KEDA and scales by the same rules itself.

A pass asks to run again every `INTERVAL_S` while autoscaling is on, and every `AT_ZERO_S` while the
service is at zero replicas: then a router holding requests is waiting for this look (its held-requests
gauge is its ask for a scale up).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime

import httpx

from folio.operator.autoscaling import Decision as Scaled
from folio.operator.autoscaling import decide
from folio.operator.autoscaling.load import LoadMeter
from folio.operator.reconcile.runtime import Runtime
from folio.operator.rollout import Decision, Event
from folio.operator.spec import AutoscalingStatus, InferenceServiceSpec

INTERVAL_S = 5.0
AT_ZERO_S = 1.0  # one scrape of the routers' /metrics per second per service at zero
SCRAPE_TIMEOUT_S = 3.0


async def scale(runtime: Runtime, meter: LoadMeter, spec: InferenceServiceSpec, decision: Decision,
                http: httpx.AsyncClient, now: datetime) -> None:
    """Set ``decision.status.autoscaling`` (and its event and requeue) from the load seen now."""
    auto = spec.autoscaling
    if auto is None:
        decision.status.autoscaling = None
        return
    if auto.keda and runtime.keda:  # say so rather than keep a stale decision
        decision.status.autoscaling = AutoscalingStatus(metric=auto.metric, keda=True,
                                                        reason="scaled by KEDA: a ScaledObject per revision")
        return
    capacity = runtime.capacity(decision.status)
    engines = capacity.metrics if auto.metric != "InFlight" else ()
    routers, engine_texts = await asyncio.gather(scrape(http, runtime.router_metrics()), scrape(http, engines))
    load = meter.load(auto, now, routers, engine_texts, ready=capacity.ready, starting=capacity.starting,
                      asked=capacity.asked)
    previous = decision.status.autoscaling
    scaled = decide(auto, previous if previous is not None and not previous.keda else None, load)
    decision.status.autoscaling = scaled.status
    if scaled.event is not None:
        decision.events.append(Event(scaled.event.type, scaled.event.reason, scaled.event.message))
    due = [x for x in (decision.requeue_after, scaled.requeue_after, interval(scaled)) if x]
    decision.requeue_after = min(due)


def interval(scaled: Scaled) -> float:
    """Seconds until the next look: sooner at zero, where held requests wait for it."""
    return AT_ZERO_S if scaled.status.desired_replicas == 0 else INTERVAL_S


async def scrape(client: httpx.AsyncClient, urls: Sequence[str]) -> dict[str, str]:
    """``{url: text}`` of the ones that answered; one that does not is left out of this look."""

    async def one(url: str) -> tuple[str, str | None]:
        try:
            resp = await client.get(url, timeout=SCRAPE_TIMEOUT_S)
            resp.raise_for_status()
            return url, resp.text
        except httpx.HTTPError:
            return url, None

    found = await asyncio.gather(*(one(u) for u in urls))
    return {url: text for url, text in found if text is not None}
