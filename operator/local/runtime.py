"""The local rollout loop: the cluster's control plane folded into one asyncio process.

Every tick (half a second) it observes what runs (weights, ready replicas, crash loops, the
router's metrics every analysis interval), asks the same pure state machine the operator uses
(`folio.operator.rollout.advance`) for the next status and the same serving plan
(`folio.operator.serving.plan`) for what should run, then makes the processes match it: an engine
group of the plan's replicas per running revision, each with the plan's command line, a pre-pull
for each revision whose weights are not verified yet, and the plan's router config written to the
file its router follows. Status is saved after every change, so a restarted `folio up` resumes
the same revisions at the same step.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import httpx
from rich.console import Console

from folio.operator.analysis.parity_run import GateRunner, poll_gate
from folio.operator.analysis.parity_sources import local_suite
from folio.operator.analysis.sampler import IntervalSampler
from folio.operator.local.autoscale import LocalAutoscaler
from folio.operator.local.render import status_table
from folio.operator.local.state import SavedState, StateDir, write_json_atomic
from folio.operator.local.supervisor import Supervisor
from folio.operator.prepull import ProgressBar, WeightsError, prepull
from folio.operator.rollout import Event, Observed, RevisionFacts, advance
from folio.operator.router.config import ConfigError, RouterConfig
from folio.operator.serving.engine import engine_flags
from folio.operator.serving.errors import PlanningError
from folio.operator.serving.plan import Placement, RevisionPlan, ServingPlan, plan
from folio.operator.spec import (
    AutoscalingStatus,
    InferenceService,
    InferenceServiceSpec,
    InferenceServiceStatus,
    RevisionStatus,
    check_name,
    revision_name,
)

ROUTER = "router"
TICK_S = 0.5
# How long a step waits for the router to report a config it was just given (it re-reads its file every 0.2 s).
ROUTER_FOLLOW_S = 5.0
SETTLED_PHASES = ("Ready", "Promoted", "RolledBack", "Failed")


def folio_argv(*args: str) -> list[str]:
    """`folio …` run with this interpreter, so children use the same environment."""
    return [sys.executable, "-m", "folio.operator.cli", *args]


@dataclass
class Weights:
    """Where the pre-pull of one digest stands (the rollout's RevisionFacts.weights)."""

    state: Literal["pending", "ready", "failed"] = "pending"
    message: str = ""


class LocalRuntime:
    def __init__(
        self,
        state_dir: StateDir,
        saved: SavedState,
        *,
        port: int,
        console: Console | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.dir = state_dir
        self.saved = saved
        self.port = port
        self.console = console or Console(stderr=True)
        self.supervisor = supervisor or Supervisor(state_dir.logs_dir, on_event=self._process_event)
        self.analysis = IntervalSampler(self.name)
        self.parity = GateRunner()  # the parity gate in flight, if any
        self._http = httpx.AsyncClient(trust_env=False)
        self.autoscaler = LocalAutoscaler(self.name, self.router_url, self._http)
        self.weights: dict[str, Weights] = {}  # by revision (the same weights are hard-linked, not pulled again)
        self._pulls: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._router_doc: dict[str, Any] | None = None
        self._router_problem = ""
        self._greeted = False

    # ------------------------------------------------------------ properties

    @property
    def name(self) -> str:
        return self.saved.manifest.name

    @property
    def spec(self) -> InferenceServiceSpec:
        return self.saved.manifest.spec

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---------------------------------------------------- the control API

    def apply(self, manifest: InferenceService) -> dict[str, Any]:
        """Take a new manifest for the running service; raises ValueError when it cannot be used."""
        if manifest.name != self.name:
            raise ValueError(
                f"this `folio up` runs InferenceService {self.name!r}; the manifest names {manifest.name!r}"
            )
        check_manifest(manifest)
        changed = manifest.spec != self.spec
        if changed:
            self.saved.manifest = manifest
            self.saved.generation += 1
            self.dir.save(self.saved)
            self._wake.set()
        return {
            "revision": revision_name(manifest.spec),
            "generation": self.saved.generation,
            "changed": changed,
        }

    def request_override(self, override: str) -> None:
        if override == "retry":  # failed pre-pulls are tried again too (the file may be fixed now)
            self.weights = {k: w for k, w in self.weights.items() if w.state != "failed"}
        self.saved.overrides.add(override)
        self.dir.save(self.saved)
        self._wake.set()

    def snapshot(self) -> dict[str, Any]:
        sup = self.supervisor
        processes = {
            group: {
                "replicas": len(slots),
                "ready": sup.ready_count(group),
                "restarts": sup.restarts(group),
                "crashLooping": sup.crash_looping(group),
                "endpoints": [r.url for r in slots],
                "pids": sup.pids(group),
            }
            for group, slots in sup.groups.items()
        }
        return {
            "name": self.name,
            "generation": self.saved.generation,
            "revision": revision_name(self.spec),
            "router": self.router_url,
            "spec": self.spec.to_wire(),
            "status": self.saved.status.to_wire(),
            "pendingOverrides": sorted(self.saved.overrides),
            "processes": processes,
        }

    # --------------------------------------------------------------- the loop

    async def run(self, stop: asyncio.Event) -> None:
        self._write_router_config()
        self.supervisor.ensure(
            ROUTER,
            1,
            lambda port: folio_argv(
                "router", "--name", self.name, "--port", str(port), "--config", str(self.dir.router_config)
            ),
            port=self.port,
        )
        self._say(f"router on {self.router_url} (state in {self.dir.root})")
        while not stop.is_set():
            await self.step()
            self._wake.clear()
            # a tick, or sooner when an apply, an override or a finished pre-pull asks for it
            wait = self.analysis.requeue(TICK_S, self.saved.status, datetime.now(timezone.utc))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def step(self) -> None:
        """One observe → decide → act round."""
        await self.supervisor.tick()
        status = self.saved.status
        now = datetime.now(timezone.utc)
        sample = None
        if self.analysis.due(self.spec.rollout.analysis, now):
            sample = await self.analysis.take(self._http, [f"{self.router_url}/metrics"], status=status,
                                              spec=self.spec.rollout.analysis, now=now)
        gate = self.spec.rollout.parity  # poll_gate starts nothing without one
        parity = poll_gate(self.parity, self._http, self.spec, status, now, urls=self.supervisor.endpoints,
                           load_suite=lambda: local_suite(gate))  # type: ignore[arg-type]
        observed = Observed(
            now=now,
            revisions={rev.name: self._facts(rev) for rev in status.revisions},
            analysis=sample,
            parity=parity,
            overrides=frozenset(self.saved.overrides),
        )
        decision = advance(self.spec, self.saved.generation, status, observed)
        decision.status.autoscaling = await self._autoscale(decision.status, now)
        self.analysis.restart(self.spec.rollout.analysis, decision.status, datetime.now(timezone.utc))
        for event in decision.events:
            self._on_event(event)
        # The router learns first and confirms before the status says anything: a phase `folio status` shows is
        # already what the router serves, and a revision's processes go only once no request is sent to them.
        serving = self._plan(decision.status)
        config = self._write_router_config(serving)
        if config is not None:
            await self._router_follows(config.fingerprint())
        changed = decision.status != status or bool(decision.overrides_done)
        self.saved.status = decision.status
        self.saved.overrides -= set(decision.overrides_done)
        if changed:
            self.dir.save(self.saved)
        if decision.status.phase != status.phase and decision.status.phase in SETTLED_PHASES:
            self.console.print(status_table(self.name, self.saved.status, self.snapshot()["processes"]))
            if not self._greeted and decision.status.traffic:
                self._greeted = True
                served = self.spec.model.served_name or self.name
                self._say(
                    f"serving [bold]{served}[/] at {self.router_url}/v1 (OpenAI API); "
                    "`folio status`, `folio apply FILE`; Ctrl-C stops everything"
                )
        self._reconcile(serving)

    async def shutdown(self) -> None:
        """Drain: the router first (it finishes in-flight requests), then every engine."""
        self._say("draining: stopping the router, then the engines")
        for task in self._pulls.values():
            task.cancel()
        self.parity.cancel()
        await self.supervisor.stop_all(order=[ROUTER])
        await self._http.aclose()
        self._say("all processes stopped")

    # ---------------------------------------------------------- observation

    def _facts(self, rev: RevisionStatus) -> RevisionFacts:
        w = self.weights.get(rev.name) or Weights("pending", "waiting to pre-pull")
        return RevisionFacts(
            weights=w.state,
            weights_message=w.message,
            ready_replicas=self.supervisor.ready_count(rev.name),
            crash_looping=self.supervisor.crash_looping(rev.name),
        )

    async def _autoscale(self, status: InferenceServiceStatus, now: datetime) -> AutoscalingStatus | None:
        """The autoscaler's decision (`spec.autoscaling`, KEDA or not: there is no KEDA here)."""
        if self.spec.autoscaling is None:
            return None
        scaled = await self.autoscaler.step(self.spec, status, self.supervisor, now)
        if scaled.event is not None:
            self._say(f"[cyan]{scaled.event.reason}[/]: {scaled.event.message}")
        return scaled.status

    # --------------------------------------------------------------- acting

    def _plan(self, status: InferenceServiceStatus | None = None) -> ServingPlan:
        endpoints = {g: self.supervisor.endpoints(g) for g in self.supervisor.groups if g != ROUTER}
        status = self.saved.status if status is None else status
        return plan(self.name, self.spec, status, Placement.this_machine(self.dir.cache_dir), endpoints)

    def _reconcile(self, serving: ServingPlan) -> None:
        for group in list(self.supervisor.groups):
            if group != ROUTER and serving.revision(group) is None:
                self._say(f"stopping revision {group}")
                self.supervisor.remove(group)
        for rev in serving.revisions:
            if rev.pull_weights:
                self._pull_weights(rev)
            if rev.replicas == 0:  # weights not verified yet, or scaled to zero
                if self.supervisor.has(rev.name):
                    self.supervisor.scale_down(rev.name, 0)
                continue
            if not self.supervisor.has(rev.name):
                self._say(f"starting {rev.replicas} replica(s) of revision {rev.name}")
            self.supervisor.ensure(
                rev.name, rev.replicas, lambda port, rev=rev: folio_argv("serve", *rev.serve_args(port))
            )
            self.supervisor.scale_down(rev.name, rev.replicas)

    def _pull_weights(self, rev: RevisionPlan) -> None:
        """Start the revision's pre-pull once (a verified copy from an earlier run makes it a quick no-op)."""
        if rev.name not in self.weights:
            w = self.weights[rev.name] = Weights("pending", "pre-pulling")
            self._pulls[rev.name] = asyncio.create_task(self._pull(rev, w))

    async def _pull(self, rev: RevisionPlan, w: Weights) -> None:
        bar = ProgressBar(quiet=not self.console.is_terminal, console=self.console, transient=True, label=rev.name)

        self._say(f"pre-pulling the weights of revision {rev.name} from {rev.model.source}")
        try:
            with bar as show:

                def progress(phase: str, done: int, total: int) -> None:
                    if show is not None:  # a log file gets the before/after lines only
                        show(phase, done, total)
                    w.message = f"{phase} {done / max(total, 1):.0%} of {total / 2**20:.0f} MiB"  # shown in status

                pulled = await asyncio.to_thread(prepull, rev.model, Path(rev.weights), progress=progress)
        except (WeightsError, OSError, ValueError) as exc:
            w.state, w.message = "failed", str(exc)
            self._say(f"[red]weights of revision {rev.name} failed[/]: {exc}")
        else:
            w.state, w.message = "ready", ""
            how = "already in the cache" if pulled.reused else f"pulled from {rev.model.source}"
            self._say(f"weights of revision {rev.name} verified ({pulled.digest}), {how}: {pulled.path}")
        self._wake.set()

    def _write_router_config(self, serving: ServingPlan | None = None) -> RouterConfig | None:
        """Writes the file the router follows when the plan's config differs from the last written; returns
        the config written, if any."""
        serving = serving or self._plan()
        try:
            config = serving.router
        except ConfigError as exc:  # the router keeps its last good config; say so once
            if str(exc) != self._router_problem:
                self._router_problem = str(exc)
                self._say(f"[red]router config[/]: {exc} (the router keeps its last good config)")
            return None
        self._router_problem = ""
        doc = config.to_wire()
        if doc == self._router_doc:
            return None
        write_json_atomic(self.dir.router_config, doc)
        self._router_doc = doc
        return config

    async def _router_follows(self, fingerprint: str) -> bool:
        """Waits until the router's `/ready` reports the config ``fingerprint`` in force, at most
        ROUTER_FOLLOW_S (a router that is down or restarting says nothing)."""
        deadline = time.monotonic() + ROUTER_FOLLOW_S
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                resp = await self._http.get(f"{self.router_url}/ready", timeout=1.0)
                if resp.json().get("config") == fingerprint:
                    return True
            if time.monotonic() >= deadline:
                self._say(f"[yellow]router[/]: its new config is not in force after {ROUTER_FOLLOW_S:.0f} s")
                return False
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------- talking

    def _on_event(self, event: Event) -> None:
        style = "yellow" if event.type == "Warning" else "green"
        self._say(f"[{style}]{event.reason}[/]: {event.message}")

    def _process_event(self, message: str) -> None:
        self._say(f"[yellow]process[/]: {message}")

    def _say(self, message: str) -> None:
        self.console.print(
            f"[dim]{datetime.now().strftime('%H:%M:%S')}[/] {message}", highlight=False, soft_wrap=True
        )


# One machine runs every replica as a process of its own: more than this is a typo, not a plan.
LOCAL_MAX_REPLICAS = 16


def check_manifest(manifest: InferenceService) -> None:
    """What the spec model cannot check but `folio up` needs; raises ValueError with the reason."""
    check_name(manifest.name)  # as the API server (and Folio's children's names) would
    if manifest.spec.replicas > LOCAL_MAX_REPLICAS:
        raise ValueError(
            f"spec.replicas {manifest.spec.replicas} is more than `folio up` runs on one machine "
            f"(at most {LOCAL_MAX_REPLICAS} engine processes per revision)"
        )
    auto = manifest.spec.autoscaling
    if auto is not None and auto.max_replicas > LOCAL_MAX_REPLICAS:
        raise ValueError(
            f"spec.autoscaling.maxReplicas {auto.max_replicas} is more than `folio up` runs on one machine "
            f"(at most {LOCAL_MAX_REPLICAS} engine processes per revision)"
        )
    if manifest.spec.model.scheme == "pvc":
        raise ValueError("pvc:// sources need a cluster; `folio up` serves file:// (and hf://) sources")
    try:
        engine_flags(manifest.spec.engine.args)
    except PlanningError as exc:
        raise ValueError(exc.message) from None
