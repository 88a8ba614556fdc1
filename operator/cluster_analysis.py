"""Analysis samples in a cluster: every router pod's /metrics (or Prometheus), once per interval.

The figures and the verdict are `folio.operator.analysis`'s, shared with the local runtime. One
`ClusterAnalysis` lives per InferenceService in the operator's memory; after a restart the first
interval only sets a baseline (Inconclusive), which costs one interval and never a wrong verdict.
Routers are scraped even while no canary runs, so a canary's first interval already has one.
"""

from __future__ import annotations

import asyncio

import httpx

from folio.operator.analysis import IntervalSampler
from folio.operator.kube import Kube, Obj
from folio.operator.planner import ROUTER_PORT, component_labels
from folio.operator.spec import AnalysisSample, InferenceServiceSpec, InferenceServiceStatus


class ClusterAnalysis:
    def __init__(self, isvc: str, namespace: str) -> None:
        self.namespace = namespace
        self.sampler = IntervalSampler(isvc)

    async def sample(self, kube: Kube, spec: InferenceServiceSpec,
                     status: InferenceServiceStatus) -> AnalysisSample | None:
        """A new sample when an interval has passed and a canary takes traffic; None otherwise."""
        if not self.sampler.due(spec.rollout.analysis):
            return None
        canary = status.canary_revision
        serving = canary is not None and any(t.revision == canary and t.weight > 0 for t in status.traffic)

        async def urls() -> list[str]:
            pods = await asyncio.to_thread(kube.list, "v1", "Pod", self.namespace,
                                           component_labels(self.sampler.isvc, "router"))
            return router_metrics_urls(pods)

        async with httpx.AsyncClient(trust_env=False) as client:
            return await self.sampler.take(client, urls, canary=canary if serving else None,
                                           stable=status.stable_revision, spec=spec.rollout.analysis)


def router_metrics_urls(pods: list[Obj]) -> list[str]:
    """`/metrics` of every running router pod, at its `http` container port."""
    urls = []
    for pod in pods:
        status = pod.get("status") or {}
        ip = status.get("podIP")
        if status.get("phase") != "Running" or not ip or (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        port = ROUTER_PORT
        for container in (pod.get("spec") or {}).get("containers") or []:
            for p in container.get("ports") or []:
                if p.get("name") == "http":
                    port = int(p["containerPort"])
        host = f"[{ip}]" if ":" in ip else ip
        urls.append(f"http://{host}:{port}/metrics")
    return sorted(urls)
