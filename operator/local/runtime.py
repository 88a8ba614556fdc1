"""The local rollout loop: the cluster's control plane folded into one asyncio process.

Every tick (half a second) it observes what runs (weights, ready replicas, crash loops, the
router's metrics every analysis interval), asks the same pure state machine the operator uses
(`folio.operator.rollout.advance`) for the next status, then makes the processes match it: an
engine group per Stable/Canary/Retiring revision (``spec.replicas`` each), none for Failed ones,
and a router config that follows ``status.traffic``. Status is saved after every change, so a
restarted `folio up` resumes the same revisions at the same step.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from rich.console import Console

from folio.operator.engine_args import PlanningError, engine_flags
from folio.operator.local.analysis_source import RouterAnalysis
from folio.operator.local.render import status_table
from folio.operator.local.state import SavedState, StateDir, write_json_atomic
from folio.operator.local.supervisor import Supervisor
from folio.operator.prepull import WeightsError, model_dir_name, prepull
from folio.operator.rollout import Event, Observed, RevisionFacts, advance
from folio.operator.spec import (
    InferenceService,
    InferenceServiceSpec,
    RevisionStatus,
    check_name,
    revision_name,
)

ROUTER = "router"
RUNNING_ROLES = ("Stable", "Canary", "Retiring")
TICK_S = 0.5
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
        self.analysis = RouterAnalysis(self.router_url, self.name)
        self.weights: dict[str, Weights] = {}  # by digest: revisions with the same weights share a pull
        self._pulls: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._router_doc: dict[str, Any] | None = None
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
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_S)

    async def step(self) -> None:
        """One observe → decide → act round."""
        await self.supervisor.tick()
        status = self.saved.status
        canary = status.canary_revision if status.canary and status.canary.weight > 0 else None
        sample = await self.analysis.sample(
            stable=status.stable_revision, canary=canary, spec=self.spec.rollout.analysis
        )
        observed = Observed(
            now=datetime.now(timezone.utc),
            revisions={rev.name: self._facts(rev) for rev in status.revisions},
            analysis=sample,
            overrides=frozenset(self.saved.overrides),
        )
        decision = advance(self.spec, self.saved.generation, status, observed)
        for event in decision.events:
            self._on_event(event)
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
        # the router learns first, so it stops sending to a revision before its processes go
        self._write_router_config()
        self._reconcile()

    async def shutdown(self) -> None:
        """Drain: the router first (it finishes in-flight requests), then every engine."""
        self._say("draining: stopping the router, then the engines")
        for task in self._pulls.values():
            task.cancel()
        await self.supervisor.stop_all(order=[ROUTER])
        await self.analysis.aclose()
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

    # --------------------------------------------------------------- acting

    def _reconcile(self) -> None:
        wanted = {r.name: r for r in self.saved.status.revisions if r.role in RUNNING_ROLES}
        for group in list(self.supervisor.groups):
            if group != ROUTER and group not in wanted:
                self._say(f"stopping revision {group}")
                self.supervisor.remove(group)
        for rev in wanted.values():
            if not self._weights_ready(rev):
                continue
            if not self.supervisor.has(rev.name):
                self._say(f"starting {self.spec.replicas} replica(s) of revision {rev.name}")
            self.supervisor.ensure(
                rev.name, self.spec.replicas, lambda port, rev=rev: self._serve_argv(rev, port)
            )
            self.supervisor.scale_down(rev.name, self.spec.replicas)

    def _weights_ready(self, rev: RevisionStatus) -> bool:
        w = self.weights.get(rev.name)
        if w is None:  # a verified copy from an earlier run makes this a quick no-op
            w = self.weights[rev.name] = Weights("pending", "pre-pulling")
            self._pulls[rev.name] = asyncio.create_task(self._pull(rev, w))
        return w.state == "ready"

    def _weights_path(self, rev: RevisionStatus) -> Path:
        """As in a cluster's cache volume: one folder per revision (same weights are hard-linked)."""
        return self.dir.cache_dir / rev.name / model_dir_name(rev.model)

    async def _pull(self, rev: RevisionStatus, w: Weights) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=self.console,
            transient=True,
            disable=not self.console.is_terminal,  # a log file gets the before/after lines only
        )
        tasks: dict[str, Any] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(f"{phase} {rev.name}", total=total)
            bar.update(tasks[phase], completed=done)
            w.message = f"{phase} {done / max(total, 1):.0%} of {total / 2**20:.0f} MiB"  # shown in status

        self._say(f"pre-pulling the weights of revision {rev.name} from {rev.model.source}")
        try:
            dest = self._weights_path(rev)
            with bar:
                pulled = await asyncio.to_thread(prepull, rev.model, dest, progress=progress)
        except (WeightsError, OSError, ValueError) as exc:
            w.state, w.message = "failed", str(exc)
            self._say(f"[red]weights of revision {rev.name} failed[/]: {exc}")
        else:
            w.state, w.message = "ready", ""
            how = "already in the cache" if pulled.reused else f"pulled from {rev.model.source}"
            self._say(f"weights of revision {rev.name} verified ({pulled.digest}), {how}: {pulled.path}")
        self._wake.set()

    def _serve_argv(self, rev: RevisionStatus, port: int) -> list[str]:
        pin = ["--digest", rev.model.digest] if rev.model.digest else []
        if rev.model.revision:
            pin += ["--revision", rev.model.revision]
        return folio_argv(
            "serve",
            "--model", str(self._weights_path(rev)),
            *pin,
            "--served-model-name", rev.model.served_name or self.name,
            "--host", "127.0.0.1",
            "--port", str(port),
            *engine_flags(rev.args),
        )  # fmt: skip

    def _write_router_config(self) -> None:
        status = self.saved.status
        doc: dict[str, Any] = {
            "traffic": [t.to_wire() for t in status.traffic],
            "endpoints": {g: self.supervisor.endpoints(g) for g in self.supervisor.groups if g != ROUTER},
        }
        if status.stable_revision:
            doc["stable"] = status.stable_revision
        if self.spec.overflow is not None:
            doc["overflow"] = {"url": self.spec.overflow.url}
        if self.spec.shadow is not None:
            doc["shadow"] = {"percent": self.spec.shadow.percent}
        if doc != self._router_doc:
            write_json_atomic(self.dir.router_config, doc)
            self._router_doc = doc

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
    if manifest.spec.model.scheme == "pvc":
        raise ValueError("pvc:// sources need a cluster; `folio up` serves file:// (and hf://) sources")
    try:
        engine_flags(manifest.spec.engine.args)
    except PlanningError as exc:
        raise ValueError(exc.message) from None
