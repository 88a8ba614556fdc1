"""The pass's adapter observation against engines and routers on a mock transport: what each engine holds
becomes facts, and one scrape of the routers serves every adapter's analysis sampler."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any, Literal

import httpx

from folio.operator.reconcile.adapters import Adapters
from folio.operator.rollout import Observed, RevisionFacts
from folio.operator.spec import (
    AdapterStatus,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RevisionStatus,
    TrafficTarget,
    adapter_revision_name,
)

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=timezone.utc)
DIGEST = "sha256:" + "ab" * 32


class Runtime:
    """Just what `Adapters.observe` asks of a runtime."""

    http = None

    def __init__(self) -> None:
        self.marked: list[Mapping[str, bool]] = []

    def engines(self, revision: str) -> Sequence[str]:
        return ["http://e1"]

    def adapter_weights(self, revision: str) -> tuple[Literal["pending", "ready", "failed"], str]:
        return "ready", ""

    async def mark_engines(self, holding: Mapping[str, bool]) -> None:
        self.marked.append(dict(holding))

    def router_metrics(self) -> list[str]:
        return ["http://router/metrics"]

    def suite(self, gate: Any) -> Any:
        raise AssertionError("no parity gate here")


def spec(*names: str) -> InferenceServiceSpec:
    return InferenceServiceSpec.model_validate({
        "model": {"source": "file:///m", "digest": DIGEST},
        "adapters": [{"name": n, "source": f"file:///a/{n}", "digest": DIGEST} for n in names],
    })  # fmt: skip


async def test_one_router_scrape_serves_every_adapter_and_holdings_become_facts() -> None:
    s = spec("sql", "chat", "docs")
    revs = {a.name: adapter_revision_name(a) for a in s.adapters}
    status = InferenceServiceStatus(
        stable_revision="b1", traffic=[TrafficTarget(revision="b1", weight=100)],
        revisions=[RevisionStatus(name="b1", role="Stable", model=s.model, image="i", args={"enableLora": True},
                                  weights_ready=True, ready_replicas=1)],
        adapters=[AdapterStatus(name=n, stable_revision=r,  # docs is new: it takes no traffic yet
                                traffic=[TrafficTarget(revision=r, weight=100)] if n != "docs" else [],
                                revisions=[RevisionStatus(name=r, role="Stable", model=s.model, image="",
                                                          weights_ready=True)])
                  for n, r in revs.items()],
    )  # fmt: skip
    calls: Counter[str] = Counter()

    def answer(request: httpx.Request) -> httpx.Response:
        calls[str(request.url)] += 1
        if request.url.path == "/v1/models":  # e1 holds sql and chat, not docs
            held = [{"id": f"{n}@{revs[n]}", "parent": "m"} for n in ("sql", "chat")]
            return httpx.Response(200, json={"data": [{"id": "m"}, *held]})
        return httpx.Response(200, text="")

    runtime = Runtime()
    observed = Observed(now=NOW, revisions={"b1": RevisionFacts("ready", ready_replicas=1)})
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        seen = await Adapters("chat").observe(runtime, s, status, observed, http)  # type: ignore[arg-type]
    assert calls["http://router/metrics"] == 1, "one scrape for the three samplers"
    assert {n: seen.adapters[n].revisions[revs[n]].ready_replicas for n in revs} == {"sql": 1, "chat": 1, "docs": 0}
    assert seen.revisions["b1"].ready_replicas == 1, "e1 holds every adapter with traffic: in rotation"
    assert runtime.marked == [{"http://e1": True}]

    status.adapters[2].traffic = [TrafficTarget(revision=revs["docs"], weight=100)]  # docs served elsewhere
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        seen = await Adapters("chat").observe(runtime, s, status, observed, http)  # type: ignore[arg-type]
    assert seen.revisions["b1"].ready_replicas == 0, "e1 lacks docs, which takes traffic: out of rotation"
    assert runtime.marked[-1] == {"http://e1": False}
