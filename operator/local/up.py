"""`folio up`: load the manifest and the state folder, run the runtime and its control endpoint.

SIGINT/SIGTERM drain and stop every child; a second signal stops them without waiting for
in-flight requests. ``--dry-run`` validates and plans the manifest, prints what would run and stops
there: no process, no state folder.

Everything user-supplied that reaches the terminal (names, paths, URLs, messages) goes through rich as
`Text` or escaped, never as markup.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import shutil
import signal
import socket
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.text import Text

from folio.operator.local.manifest import ManifestError, read_manifest
from folio.operator.local.state import SavedState, StateDir, StateError
from folio.operator.serving.plan import Placement, ServingPlan
from folio.operator.serving.validate import THIS_MACHINE, Problem, parse_manifest
from folio.operator.spec import InferenceService, InferenceServiceSpec, revision_name


def say(console: Console, message: str, style: str = "", *, label: str = "folio up:") -> None:
    """One line: the label (in ``style``), then ``message`` as plain text, never read as markup."""
    line = Text.assemble((label, style), " ", message) if label else Text(message)
    console.print(line, highlight=False, soft_wrap=True)


def refuse(console: Console, problems: Sequence[Problem], *, command: str = "up") -> int:
    """One line per problem, `folio up: <path>: <message>`; exit code 1."""
    for problem in problems:
        say(console, str(problem), "red", label=f"folio {command}:")
    return 1


def run_up(
    file: str | Path, *, port: int, state_dir: str | Path, console: Console | None = None, dry_run: bool = False,
    secrets_dir: str | Path | None = None,
) -> int:
    out = console or Console()  # --dry-run's plan: stdout, unless a console is given
    console = console or Console(stderr=True)
    try:
        doc = read_manifest(file)
    except ManifestError as exc:
        say(console, str(exc), "red")
        return 1
    manifest, problems = parse_manifest(doc, THIS_MACHINE)
    if problems or manifest is None:
        return refuse(console, problems)
    args = manifest.spec.engine.args
    if shutil.which("nvidia-smi") and not {"kvCacheMemoryGib", "gpuMemoryUtilization"} & set(args):
        # each engine sizes its KV cache from what the GPU has free when it starts, so the first
        # one would leave no room for a canary beside it
        say(console, "on a GPU, stable and canary engines share it: set spec.engine.args.kvCacheMemoryGib so "
            "that two of them fit side by side", "yellow")  # fmt: skip
    if dry_run:
        return show_plan(manifest, port=port, state_dir=state_dir, console=out, errors=console)
    if not 0 < port < 65536 or not _port_free(port):
        say(console, f"port {port} is not available; pass another --port", "red")
        return 1

    d = StateDir(state_dir)
    try:
        d.lock()
        saved = d.load()
    except StateError as exc:
        say(console, str(exc), "red")
        d.unlock()
        return 1
    try:
        if saved is None:
            saved = SavedState(manifest=manifest)
        elif saved.manifest.name != manifest.name:
            say(console, f"the state folder {d.root} belongs to InferenceService {saved.manifest.name!r}; "
                f"pass another --state-dir for {manifest.name!r}", "red")  # fmt: skip
            return 1
        else:
            say(console, f"resuming {manifest.name!r} from {d.root}: stable {saved.status.stable_revision or '-'}, "
                f"canary {saved.status.canary_revision or '-'}", label="")  # fmt: skip
            if saved.manifest.spec != manifest.spec:
                saved.manifest, saved.generation = manifest, saved.generation + 1
        d.save(saved)
        say(console, f"InferenceService {manifest.name!r}, revision {revision_name(manifest.spec)}")
        secrets = Path(secrets_dir).resolve() if secrets_dir is not None else d.root / "secrets"
        asyncio.run(_serve(d, saved, port, console, secrets))
    finally:
        d.clear_control()
        d.unlock()
    return 0


async def _serve(d: StateDir, saved: SavedState, port: int, console: Console, secrets_dir: Path) -> None:
    from folio.operator.local.control import make_server
    from folio.operator.local.runtime import LocalRuntime

    runtime = LocalRuntime(d, saved, port=port, console=console, secrets_dir=secrets_dir)
    server, sock, url, token = make_server(runtime)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signame: str) -> None:
        if stop.is_set():  # the second Ctrl-C: do not wait for in-flight requests
            say(console, f"{signame} again: stopping without draining", label="")
            runtime.supervisor.stop_timeout = 0.0
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig.name)
    control = asyncio.create_task(server.serve(sockets=[sock]))
    d.write_control(url, token)
    try:
        await runtime.run(stop)
    finally:
        d.clear_control()
        await runtime.shutdown()
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await control
        sock.close()


# ------------------------------------------------------------------------------ --dry-run


def first_plan(name: str, spec: InferenceServiceSpec, placement: Placement, now: datetime | None = None) -> ServingPlan:
    """What a fresh `folio up` runs once its first revision is in place: the rollout state machine
    (`folio.operator.rollout.advance`) admits the revision, sees its weights verified and its replicas ready,
    and the plan of that status has the revision's engines and the router's config with its traffic."""
    from folio.operator.rollout import Observed, RevisionFacts, advance
    from folio.operator.serving.plan import plan
    from folio.operator.spec import InferenceServiceStatus

    now = now or datetime.now(timezone.utc)
    rev = revision_name(spec)
    status = advance(spec, 1, InferenceServiceStatus(), Observed(now=now)).status  # admitted; weights pending
    status = advance(spec, 1, status, Observed(now=now, revisions={rev: RevisionFacts("ready")})).status
    planned = plan(name, spec, status, placement).revision(rev)
    ready = RevisionFacts("ready", ready_replicas=planned.replicas if planned is not None else 0)
    status = advance(spec, 1, status, Observed(now=now, revisions={rev: ready})).status
    return plan(name, spec, status, placement)


def show_plan(
    manifest: InferenceService, *, port: int, state_dir: str | Path, console: Console, errors: Console | None = None
) -> int:
    """`folio up --dry-run`: print what would run for ``manifest`` (valid: see `parse_manifest`); start and
    write nothing. 0, or 1 when it cannot be planned."""
    from folio.operator.prepull import read_record
    from folio.operator.serving.errors import PlanningError

    d = StateDir(state_dir)  # paths only: nothing is created
    try:
        serving = first_plan(manifest.name, manifest.spec, Placement.this_machine(d.cache_dir))
        router = serving.router.to_wire()
    except (PlanningError, ValueError, ArithmeticError) as exc:  # validation should have said so
        say(errors or console, f"cannot plan {manifest.name!r}: {exc}", "red")
        return 1
    say(console, f"InferenceService {manifest.name!r} is valid; this is what `folio up` would run "
        "(--dry-run: nothing started, nothing written)", "green", label="folio up --dry-run:")  # fmt: skip
    if d.state_file.exists():
        say(console, f"note: {d.state_file} exists: `folio up` would resume the revisions saved there; this "
            "plan is a fresh start's", "yellow", label="")  # fmt: skip
    for rev in serving.revisions:
        model = rev.model
        say(console, f"revision {rev.name} ({rev.role}) serving {model.source} as {rev.served_name!r}", "bold",
            label="")  # fmt: skip
        record = read_record(Path(rev.weights))
        if record is not None and record.get("source") == model.source and record.get("revision") == model.revision:
            weights = f"already verified in the cache at {rev.weights}"
        else:
            pin = model.digest or (f"commit {model.revision}" if model.revision else "its pin")
            weights = f"pre-pulled from {model.source} into {rev.weights} and verified against {pin}"
        say(console, f"  weights: {weights}, before any engine starts", label="")
        say(console, f"  engines: {rev.replicas} replica(s), each a process on its own loopback port:", label="")
        args = rev.serve_args(0)
        args[args.index("--port") + 1] = "PORT"
        say(console, f"    folio serve {shlex.join(args)}", label="")
    say(console, f"router: http://127.0.0.1:{port}/v1 (OpenAI API); state folder {d.root}; "
        "its config (endpoints: each replica's port, added as it becomes ready):", label="")  # fmt: skip
    for line in json.dumps(router, indent=2, sort_keys=True).splitlines():
        say(console, f"  {line}", label="")
    if not 0 < port < 65536 or not _port_free(port):
        say(console, f"note: port {port} is not available now; pass another --port", "yellow", label="")
    return 0


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
