"""`folio up`'s autoscaling step: the operator's decision (`folio.operator.autoscaling`) on engine processes.

Every tick it reads its router's `/metrics` (in flight, held, requests counted) and, for Waiting and
KVCache, every ready engine's; ready and starting replicas come from the process supervisor. The
decision goes into ``status.autoscaling``, from which the serving plan takes its replica counts, so
that the runtime starts or stops engine processes exactly as the operator scales Deployments. A
router holding requests needs no call to ask for a scale up here: the held-requests gauge it exports
is read at the next tick.
"""

from __future__ import annotations

from datetime import datetime

import httpx

from folio.operator.autoscaling.decide import Decision, decide
from folio.operator.autoscaling.load import LoadMeter
from folio.operator.controller.autoscale import scrape
from folio.operator.local.supervisor import Supervisor
from folio.operator.serving.plan import RUNNING_ROLES
from folio.operator.spec import InferenceServiceSpec, InferenceServiceStatus


class LocalAutoscaler:
    def __init__(self, isvc: str, router_url: str, http: httpx.AsyncClient) -> None:
        self.meter = LoadMeter(isvc)
        self.router_url = router_url
        self._http = http

    async def step(self, spec: InferenceServiceSpec, status: InferenceServiceStatus, supervisor: Supervisor,
                   now: datetime) -> Decision:
        auto = spec.autoscaling
        assert auto is not None
        running = [r.name for r in status.revisions if r.role in RUNNING_ROLES]
        ready = sum(supervisor.ready_count(name) for name in running)
        asked = sum(len(supervisor.groups.get(name, [])) for name in running)
        engines = [f"{url}/metrics" for name in running for url in supervisor.endpoints(name)]
        routers = await scrape(self._http, [f"{self.router_url}/metrics"])
        engine_texts = await scrape(self._http, engines) if auto.metric != "InFlight" else {}
        load = self.meter.load(auto, now, routers, engine_texts, ready=ready, starting=max(0, asked - ready))
        return decide(auto, status.autoscaling, load)
