"""The local rollout loop: the cluster's control plane folded into one asyncio process.

Every tick (half a second) it observes what runs (weights, ready replicas, crash loops, the
router's metrics every analysis interval), asks the same pure state machine the operator uses
(`folio.operator.rollout.advance`) for the next status and the same serving plan
(`folio.operator.serving.plan`) for what should run, then makes the processes match it: an engine
group of the plan's replicas per running revision, each with the plan's command line, a pre-pull
for each revision whose weights are not verified yet, and the plan's router config written to the
file its router follows (a revision whose replica spans several pods in a cluster runs each replica as
that many processes: `replica_processes`). Status is saved after every change, so a restarted `folio up` resumes
the same revisions at the same step.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import httpx
from rich.console import Console
from rich.markup import escape

from folio.operator.local.render import status_table
from folio.operator.local.state import SavedState, StateDir, write_json_atomic
from folio.operator.local.supervisor import Process, Supervisor
from folio.operator.parity import SuitePrompt, local_suite
from folio.operator.prepull import DraftPull, ProgressBar, WeightsError, prepull
from folio.operator.reconcile import Capacity, Memory, Target, run_pass
from folio.operator.rollout import Decision, Event, Observed, RevisionFacts
from folio.operator.router.secrets import FolderSecrets
from folio.operator.router.tenants import access_unavailable
from folio.operator.serving.adapters import AdapterRevisionPlan
from folio.operator.serving.plan import RUNNING_ROLES, Placement, RevisionPlan, ServingPlan
from folio.operator.serving.router import RouterConfig
from folio.operator.serving.validate import THIS_MACHINE, Site, validate
from folio.operator.spec import (
    InferenceService,
    InferenceServiceSpec,
    InferenceServiceStatus,
    ModelSource,
    ParitySpec,
    RevisionStatus,
    revision_name,
)

ROUTER = "router"
LOOPBACK = "127.0.0.1"  # a group's leader, for its workers (`LWS_LEADER_ADDRESS`)
TICK_S = 0.5
# How long a step waits for the router to report a config it was just given (it re-reads its file every 0.2 s).
ROUTER_FOLLOW_S = 5.0
SETTLED_PHASES = ("Ready", "Promoted", "RolledBack", "Failed", "Paused")


def folio_argv(*args: str) -> list[str]:
    """`folio …` run with this interpreter, so children use the same environment."""
    return [sys.executable, "-m", "folio.operator.cli", *args]


def replica_processes(rev: RevisionPlan, port: int, master_port: int) -> list[Process]:
    """A replica that spans several pods in a cluster (a LeaderWorkerSet's group), as processes on this
    machine wired the same way: node 0 serves on ``port``, nodes 1.. are `--headless` workers, each with the
    environment LeaderWorkerSet would give its pod (the leader on loopback), all on the replica's own
    ``master_port``."""
    leader = (folio_argv("serve", *rev.serve_args(port, master_port)), rev.group_env(0, LOOPBACK))
    workers = [(folio_argv("serve", *rev.worker_args(master_port)), rev.group_env(node, LOOPBACK))
               for node in range(1, rev.group_size)]
    return [leader, *workers]


@dataclass
class Weights:
    """Where the pre-pull of one digest stands (the rollout's RevisionFacts.weights)."""

    state: Literal["pending", "ready", "failed"] = "pending"
    message: str = ""


class LocalRuntime:
    """This machine as a pass's runtime (`folio.operator.reconcile.Runtime`): engine processes, one router, status
    in the state folder."""

    site: Site = THIS_MACHINE
    keda = False  # no KEDA here: the pass's autoscaler scales engine processes by the same rules

    def __init__(
        self,
        state_dir: StateDir,
        saved: SavedState,
        *,
        port: int,
        console: Console | None = None,
        supervisor: Supervisor | None = None,
        secrets_dir: Path | None = None,
    ) -> None:
        self.dir = state_dir
        self.secrets_dir = secrets_dir or state_dir.root / "secrets"  # spec.access's Secret of API keys
        self.saved = saved
        self.port = port
        self.console = console or Console(stderr=True)
        self.supervisor = supervisor or Supervisor(state_dir.logs_dir, on_event=self._process_event)
        self.memory = Memory(self.name)
        self.http = httpx.AsyncClient(trust_env=False)
        self.placement = Placement.this_machine(state_dir.cache_dir)
        self.weights: dict[str, Weights] = {}  # by revision (the same weights are hard-linked, not pulled again)
        self.adapter_files: dict[str, Weights] = {}  # by adapter revision
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
        """Take a new manifest for the running service; raises ValueError when it cannot be used (one
        line per problem, each naming its field)."""
        if manifest.name != self.name:
            raise ValueError(
                f"metadata.name: this `folio up` runs InferenceService {self.name!r}; the manifest names "
                f"{manifest.name!r}"
            )
        problems = validate(manifest.name, manifest.spec, self.site)
        if problems:
            raise ValueError("\n".join(str(p) for p in problems))
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
        if override.partition("@")[0] == "retry":  # failed pre-pulls are tried again too (the file may be fixed now)
            self.weights = {k: w for k, w in self.weights.items() if w.state != "failed"}
            self.adapter_files = {k: w for k, w in self.adapter_files.items() if w.state != "failed"}
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
        # The router waits for its config file; the first pass writes it and waits for the router to follow.
        self.supervisor.ensure(
            ROUTER,
            1,
            lambda port: folio_argv(
                "router", "--name", self.name, "--port", str(port), "--config", str(self.dir.router_config),
                "--secrets-dir", str(self.secrets_dir),
            ),
            port=self.port,
        )
        self._say(f"router on {escape(self.router_url)} (state in {escape(str(self.dir.root))})")
        while not stop.is_set():
            decision = await self.step()
            self._wake.clear()
            # a tick, or sooner when an apply, an override or a finished pre-pull asks for it
            wait = min(TICK_S, decision.requeue_after or TICK_S)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)

    async def step(self) -> Decision:
        """One pass (`folio.operator.reconcile.run_pass`), the same the operator runs."""
        target = Target(self.name, self.spec, self.saved.generation, self.saved.status)
        return (await run_pass(self, self.memory, target)).decision

    async def shutdown(self) -> None:
        """Drain: the router first (it finishes in-flight requests), then every engine."""
        self._say("draining: stopping the router, then the engines")
        for task in self._pulls.values():
            task.cancel()
        self.memory.parity.cancel()
        self.memory.adapters.cancel()
        await self.supervisor.stop_all(order=[ROUTER])
        await self.http.aclose()
        self._say("all processes stopped")

    # ------------------------------------------------------- what a pass observes

    async def observe(self, spec: InferenceServiceSpec, status: InferenceServiceStatus, now: datetime) -> Observed:
        await self.supervisor.tick()
        ref = spec.access.api_keys_secret_ref if spec.access is not None else None
        keys = await asyncio.to_thread(FolderSecrets(self.secrets_dir).read, ref.name) if ref is not None else None
        access = access_unavailable(spec.access, keys)
        return Observed(
            now=now,
            revisions={rev.name: self._facts(rev) for rev in status.revisions},
            overrides=frozenset(self.saved.overrides),
            unavailable=(access,) if access is not None else (),
        )

    def _facts(self, rev: RevisionStatus) -> RevisionFacts:
        w = self.weights.get(rev.name) or Weights("pending", "waiting to pre-pull")
        return RevisionFacts(
            weights=w.state,
            weights_message=w.message,
            ready_replicas=self.supervisor.ready_count(rev.name),
            crash_looping=self.supervisor.crash_looping(rev.name),
        )

    def adapter_weights(self, revision: str) -> tuple[Literal["pending", "ready", "failed"], str]:
        w = self.adapter_files.get(revision) or Weights("pending", "waiting to pre-pull")
        return w.state, w.message

    def engines(self, revision: str) -> Sequence[str]:
        return self.supervisor.endpoints(revision)

    async def mark_engines(self, holding: Mapping[str, bool]) -> None:
        pass  # the pass gives the router only the replicas that hold them (`Adapters.endpoints`)

    def router_metrics(self) -> list[str]:
        return [f"{self.router_url}/metrics"]

    def capacity(self, status: InferenceServiceStatus) -> Capacity:
        running = [r.name for r in status.revisions if r.role in RUNNING_ROLES]
        ready = sum(self.supervisor.ready_count(name) for name in running)
        asked = sum(len(self.supervisor.groups.get(name, [])) for name in running)
        engines = [f"{url}/metrics" for name in running for url in self.supervisor.endpoints(name)]
        return Capacity(ready, max(0, asked - ready), engines)

    def replica_urls(self, revision: str) -> Sequence[str]:
        return self.supervisor.endpoints(revision)

    def suite(self, gate: ParitySpec) -> Callable[[], Awaitable[list[SuitePrompt]]]:
        return lambda: local_suite(gate)

    def endpoints(self) -> Mapping[str, Sequence[str]]:
        return {g: self.supervisor.endpoints(g) for g in self.supervisor.groups if g != ROUTER}

    # --------------------------------------------------------------- acting

    async def execute(self, serving: ServingPlan | None, decision: Decision) -> None:
        status = self.saved.status
        for event in decision.events:
            self._on_event(event)
        # The router learns first and confirms before the status says anything: a phase `folio status` shows is
        # already what the router serves, and a revision's processes go only once no request is sent to them.
        if serving is not None:
            config = self._write_router_config(serving.router)
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
                served = escape(self.spec.model.served_name or self.name)
                self._say(
                    f"serving [bold]{served}[/] at {escape(self.router_url)}/v1 (OpenAI API); "
                    "`folio status`, `folio apply FILE`; Ctrl-C stops everything"
                )
            elif not decision.status.traffic and decision.status.failed_revisions:
                # nothing can serve until the manifest changes: say that `folio up` is waiting, and for what
                failed = decision.status.failed_revisions[-1]
                self._say(
                    f"[yellow]nothing serves: revision {escape(failed.revision)} failed ({escape(failed.reason)}); "
                    "`folio up` keeps running and waits for a fixed manifest: `folio apply FILE` (or Ctrl-C to "
                    "stop)[/]"
                )
        if serving is not None:
            self._run(serving)

    def _run(self, serving: ServingPlan) -> None:
        """The plan's processes: an engine group per running revision, its pre-pull first."""
        for group in list(self.supervisor.groups):
            if group != ROUTER and serving.revision(group) is None:
                self._say(f"stopping revision {escape(group)}")
                self.supervisor.remove(group)
        for pull in serving.adapters.pulls:
            self._pull_adapter(pull)
        for rev in serving.revisions:
            if rev.pull_weights:
                self._pull_weights(rev)
            if rev.replicas == 0:  # weights not verified yet, or scaled to zero
                if self.supervisor.has(rev.name):
                    self.supervisor.scale_down(rev.name, 0)
                continue
            if not self.supervisor.has(rev.name):
                each = f" of {rev.group_size} processes each" if rev.group_size > 1 else ""
                self._say(f"starting {rev.replicas} replica(s){each} of revision {escape(rev.name)}")
            if rev.group_size > 1:
                self.supervisor.ensure_groups(
                    rev.name, rev.replicas, lambda port, master, rev=rev: replica_processes(rev, port, master))
            else:
                self.supervisor.ensure(
                    rev.name, rev.replicas, lambda port, rev=rev: folio_argv("serve", *rev.serve_args(port))
                )
            self.supervisor.scale_down(rev.name, rev.replicas)

    def _pull_weights(self, rev: RevisionPlan) -> None:
        """Start the revision's pre-pull once (a verified copy from an earlier run makes it a quick no-op)."""
        if rev.name not in self.weights:
            w = self.weights[rev.name] = Weights("pending", "pre-pulling")
            self._pulls[rev.name] = asyncio.create_task(
                self._pull(f"weights of revision {rev.name}", rev.model, rev.weights, w, rev.parallel, rev.draft_pull))

    def _pull_adapter(self, rev: AdapterRevisionPlan) -> None:
        """The same for an adapter revision's files."""
        if rev.revision not in self.adapter_files:
            w = self.adapter_files[rev.revision] = Weights("pending", "pre-pulling")
            what = f"adapter {rev.adapter} revision {rev.revision}"
            self._pulls[f"adapter {rev.revision}"] = asyncio.create_task(self._pull(what, rev.pin, rev.path, w))

    async def _pull(self, what: str, pin: ModelSource, dest: str, w: Weights, parallel: tuple[int, int] = (1, 1),
                    draft: DraftPull | None = None) -> None:  # fmt: skip
        bar = ProgressBar(quiet=not self.console.is_terminal, console=self.console, transient=True, label=what)

        self._say(escape(f"pre-pulling the {what} from {pin.source}"))
        try:
            with bar as show:

                def progress(phase: str, done: int, total: int) -> None:
                    if show is not None:  # a log file gets the before/after lines only
                        show(phase, done, total)
                    w.message = f"{phase} {done / max(total, 1):.0%} of {total / 2**20:.0f} MiB"  # shown in status

                pulled = await asyncio.to_thread(prepull, pin, Path(dest), progress=progress, parallel=parallel,
                                                 draft=draft)  # fmt: skip
        except (WeightsError, OSError, ValueError) as exc:
            w.state, w.message = "failed", str(exc)
            self._say(f"[red]{escape(what)} failed[/]: {escape(str(exc))}")
        else:
            w.state, w.message = "ready", ""
            how = "already in the cache" if pulled.reused else f"pulled from {pin.source}"
            also = f" (and its draft model, {draft.pin.source}: {draft.dest})" if draft is not None else ""
            self._say(escape(f"{what} verified ({pulled.digest}), {how}: {pulled.path}{also}"))
        self._wake.set()

    def _write_router_config(self, config: RouterConfig) -> RouterConfig | None:
        """Writes the file the router follows when ``config`` differs from the last written; returns it then."""
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
                resp = await self.http.get(f"{self.router_url}/ready", timeout=1.0)
                if resp.json().get("config") == fingerprint:
                    return True
            if time.monotonic() >= deadline:
                self._say(f"[yellow]router[/]: its new config is not in force after {ROUTER_FOLLOW_S:.0f} s")
                return False
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------- talking

    def _on_event(self, event: Event) -> None:
        style = "yellow" if event.type == "Warning" else "green"
        self._say(f"[{style}]{escape(event.reason)}[/]: {escape(event.message)}")

    def _process_event(self, message: str) -> None:
        self._say(f"[yellow]process[/]: {escape(message)}")

    def _say(self, message: str) -> None:
        """``message`` is rich markup: escape whatever in it came from a user, a file or another process."""
        self.console.print(
            f"[dim]{datetime.now().strftime('%H:%M:%S')}[/] {message}", highlight=False, soft_wrap=True, emoji=False
        )
