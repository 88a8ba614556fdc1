"""The pass's adapter steps: what the engines hold (observed), and making them hold what the plan says.

Before the rollout decides, `Adapters.observe` asks every ready engine replica of the running base revisions
which adapter revisions it holds (``GET /v1/models``: each adapter card names its parent) and turns that
into facts: an adapter revision is ready once every replica in rotation holds it (so the router never
sends it to one that would answer 404); a base replica is in rotation only while it holds every adapter
revision that takes traffic (`AdapterPlan.required`), so a new base revision takes no traffic before it
loaded every current adapter, and a restarted replica none before it loaded them again. It also takes each
adapter's analysis sample (the router's series of that adapter) and runs its parity gate.

After the plan is carried out (the router already follows it), `Adapters.sync` loads what a replica lacks
and unloads what it no longer needs, through the engine's runtime endpoints (vLLM's
``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``), so no engine restarts. An unload lets the
adapter's running requests finish; new ones get 404 (the router no longer names the adapter by then). An
engine that refuses a load (a 400: the files do not fit the base model, or a rank above ``maxLoraRank``)
fails that adapter revision, whose rollout then rolls it back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import httpx

from folio.operator.analysis.router_scrape import Scraped, scrape_routers
from folio.operator.analysis.sampler import IntervalSampler
from folio.operator.parity import GateRunner, poll_gate
from folio.operator.parity.run import error_message
from folio.operator.reconcile.runtime import Runtime
from folio.operator.rollout import Observed, RevisionFacts
from folio.operator.rollout.adapters import adapter_view, as_service_status
from folio.operator.rollout.types import AdapterObserved
from folio.operator.serving.adapters import AdapterRevisionPlan, engine_name, required_adapters
from folio.operator.serving.plan import RUNNING_ROLES, ServingPlan
from folio.operator.spec import AdapterSpec, AdapterStatus, InferenceServiceSpec, InferenceServiceStatus

log = logging.getLogger(__name__)

TIMEOUT_S = 30.0  # one load (an adapter's files read and checked) or unload at most


@dataclass
class AdapterMemory:
    """One adapter's state between passes: its analysis sampler and parity gate."""

    sampler: IntervalSampler
    parity: GateRunner = field(default_factory=GateRunner)


@dataclass
class Adapters:
    isvc: str
    holdings: dict[str, frozenset[str]] = field(default_factory=dict)  # replica URL -> engine names it holds
    refused: dict[str, str] = field(default_factory=dict)  # engine name -> why an engine refused to load it
    per_adapter: dict[str, AdapterMemory] = field(default_factory=dict)

    # ----------------------------------------------------------------------- observing

    async def observe(self, runtime: Runtime, spec: InferenceServiceSpec, status: InferenceServiceStatus,
                      observed: Observed, http: httpx.AsyncClient) -> Observed:
        if not (spec.adapters or status.adapters or _lora_on(status)):
            self.holdings = {}  # no engine serves adapters: nothing to ask them
            return observed
        for retry in (x.partition("@")[2] for x in observed.overrides if x.startswith("retry@")):
            self.refused = {name: why for name, why in self.refused.items() if not name.startswith(f"{retry}@")}
        replicas = _replicas(runtime, status)
        self.holdings = await _holdings(http, [u for urls in replicas.values() for u in urls])
        required = required_adapters(status)
        await runtime.mark_engines({u: self.holds(u, required) for urls in replicas.values() for u in urls
                                    if u in self.holdings})
        if not spec.adapters and not status.adapters:
            return observed
        serving = {t.revision for t in status.traffic if t.weight > 0}
        rotation = [u for rev, urls in replicas.items() if rev in serving for u in urls if self.holds(u, required)]
        revisions = {
            rev: dataclasses.replace(facts, ready_replicas=min(facts.ready_replicas, sum(
                self.holds(u, required) for u in replicas.get(rev, ()))))
            for rev, facts in observed.revisions.items()
        }  # fmt: skip
        seen = {}
        scraped: list[Scraped] = []  # the routers' /metrics, scraped once for every adapter due a sample
        for adapter in spec.adapters:
            before = status.adapter(adapter.name) or AdapterStatus(name=adapter.name)
            seen[adapter.name] = await self._observe_one(runtime, spec, adapter, before, observed, rotation, http,
                                                         scraped)
        return dataclasses.replace(observed, revisions=revisions, adapters=seen)

    def holds(self, url: str, names: frozenset[str]) -> bool:
        return names <= self.holdings.get(url, frozenset())

    async def _observe_one(self, runtime: Runtime, spec: InferenceServiceSpec, adapter: AdapterSpec,
                           status: AdapterStatus, observed: Observed, rotation: Sequence[str],
                           http: httpx.AsyncClient, scraped: list[Scraped]) -> AdapterObserved:
        memory = self.per_adapter.setdefault(adapter.name, AdapterMemory(IntervalSampler(self.isvc, adapter.name)))
        facts = {}
        for rev in status.revisions:
            name = engine_name(adapter.name, rev.name)
            state, message = ("ready", "") if rev.weights_ready else runtime.adapter_weights(rev.name)
            if state == "ready" and name in self.refused:
                state, message = "failed", self.refused[name]
            holders = [u for u in rotation if name in self.holdings.get(u, frozenset())]
            ready = len(holders) if rotation and len(holders) == len(rotation) else 0
            facts[rev.name] = RevisionFacts(state, message, ready_replicas=ready)
        view, view_status = adapter_view(spec, adapter), as_service_status(status)
        analysis = view.rollout.analysis
        sample = None
        if memory.sampler.due(analysis, observed.now):
            if analysis.prometheus is None and not scraped:
                scraped.append(await scrape_routers(http, runtime.router_metrics()))
            sample = await memory.sampler.take(http, runtime.router_metrics(), status=status, spec=analysis,
                                               now=observed.now, scraped=scraped[0] if scraped else None)
        report = None
        if view.rollout.parity is not None:
            gate = view.rollout.parity
            report = poll_gate(
                memory.parity, runtime.http, view, view_status, observed.now,
                urls=lambda rev: [u for u in rotation if engine_name(adapter.name, rev) in self.holdings.get(u, ())],
                load_suite=lambda: runtime.suite(gate)(), model=lambda rev: engine_name(adapter.name, rev),
            )  # fmt: skip
        overrides = frozenset(o for o, _, a in (x.partition("@") for x in observed.overrides) if a == adapter.name)
        return AdapterObserved(facts, sample, report, overrides)

    def endpoints(self, runtime: Runtime, status: InferenceServiceStatus) -> dict[str, list[str]]:
        """Each base revision's replicas in rotation: those holding every adapter revision that takes traffic."""
        required = required_adapters(status)
        return {rev: [u for u in urls if self.holds(u, required)] for rev, urls in runtime.endpoints().items()}

    def restart(self, spec: InferenceServiceSpec, status: InferenceServiceStatus, now: datetime) -> None:
        """After a decision: each adapter canary's samples count from its traffic; gone adapters forgotten."""
        names = {a.name for a in spec.adapters}
        for name in set(self.per_adapter) - names:
            self.per_adapter.pop(name).parity.cancel()
        for adapter in spec.adapters:
            memory, st = self.per_adapter.get(adapter.name), status.adapter(adapter.name)
            if memory is not None and st is not None:
                memory.sampler.restart(adapter_view(spec, adapter).rollout.analysis, st, now)

    def cancel(self) -> None:
        for memory in self.per_adapter.values():
            memory.parity.cancel()

    # ---------------------------------------------------------------------------- acting

    async def sync(self, runtime: Runtime, serving: ServingPlan, http: httpx.AsyncClient) -> bool:
        """Every ready replica of the running base revisions holds exactly the plan's verified adapter revisions;
        True when something was loaded or unloaded (the next pass should look soon)."""
        if not self.holdings:
            return False  # no engine serves adapters, or none answered this pass's question
        loads = serving.adapters.loads
        replicas = [u for r in serving.revisions for u in runtime.engines(r.name)]
        return any(await asyncio.gather(*(self._sync_one(http, url, loads) for url in replicas)))

    async def _sync_one(self, http: httpx.AsyncClient, url: str, loads: Mapping[str, AdapterRevisionPlan]) -> bool:
        have = self.holdings.get(url)
        if have is None:
            return False  # not seen by this pass's observation (just ready): the next pass syncs it
        changed = False
        for name in sorted(have - loads.keys()):
            await self._call(http, url, "unload", {"lora_name": name})
            changed = True
        for name, plan in loads.items():
            if name in have or name in self.refused:
                continue
            changed = True
            body = {"lora_name": name, "lora_path": plan.path, "served_name": plan.adapter}
            if plan.pin.digest:
                body["digest"] = plan.pin.digest
            refused = await self._call(http, url, "load", body)
            if refused is not None:
                self.refused[name] = f"an engine refused to load it: {refused}"
        return changed

    async def _call(self, http: httpx.AsyncClient, url: str, verb: str, body: dict[str, str]) -> str | None:
        """POST one load or unload; the engine's message when it refuses (400), None otherwise (an engine that is
        away or busy is tried again by the next pass)."""
        try:
            resp = await http.post(f"{url}/v1/{verb}_lora_adapter", json=body, timeout=TIMEOUT_S)
        except httpx.HTTPError as exc:
            log.warning("%s of adapter %s on %s failed: %r", verb, body["lora_name"], url, exc)
            return None
        if resp.status_code == 400 and verb == "load":
            return error_message(resp)
        if resp.status_code >= 300 and resp.status_code != 404:  # 404 on unload: already gone
            log.warning("%s of adapter %s on %s: %s %s", verb, body["lora_name"], url, resp.status_code,
                        error_message(resp))
        return None


def _lora_on(status: InferenceServiceStatus) -> bool:
    """A running revision's engines serve adapters (and, in a cluster, wait on the adapters gate)."""
    return any(r.args.get("enableLora") is True for r in status.revisions if r.role in RUNNING_ROLES)


def _replicas(runtime: Runtime, status: InferenceServiceStatus) -> dict[str, list[str]]:
    return {r.name: list(runtime.engines(r.name)) for r in status.revisions if r.role in RUNNING_ROLES}


async def _holdings(http: httpx.AsyncClient, urls: Sequence[str]) -> dict[str, frozenset[str]]:
    """Replica URL → the adapters it holds, for those that answered."""

    async def one(url: str) -> tuple[str, frozenset[str] | None]:
        try:
            resp = await http.get(f"{url}/v1/models", timeout=5.0)
            resp.raise_for_status()
            cards = resp.json()["data"]
            return url, frozenset(c["id"] for c in cards if c.get("parent"))
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return url, None

    found = await asyncio.gather(*(one(u) for u in urls))
    return {url: held for url, held in found if held is not None}

