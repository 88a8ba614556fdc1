"""`folio up`: load the manifest and the state folder, run the runtime and its control endpoint.

SIGINT/SIGTERM drain and stop every child; a second signal stops them without waiting for
in-flight requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
from pathlib import Path

from rich.console import Console

from folio.operator.local.control import make_server
from folio.operator.local.manifest import ManifestError, load_manifest
from folio.operator.local.runtime import LocalRuntime, check_manifest
from folio.operator.local.state import SavedState, StateDir, StateError
from folio.operator.spec import revision_name


def run_up(file: str | Path, *, port: int, state_dir: str | Path, console: Console | None = None) -> int:
    console = console or Console(stderr=True)
    try:
        manifest = load_manifest(file)
        check_manifest(manifest)
    except (ManifestError, ValueError) as exc:
        console.print(f"[red]folio up:[/] {exc}", highlight=False, soft_wrap=True)
        return 1
    args = manifest.spec.engine.args
    if shutil.which("nvidia-smi") and not {"kvCacheMemoryGib", "gpuMemoryUtilization"} & set(args):
        # each engine sizes its KV cache from what the GPU has free when it starts, so the first
        # one would leave no room for a canary beside it
        console.print(
            "[yellow]folio up:[/] on a GPU, stable and canary engines share it: set spec.engine.args."
            "kvCacheMemoryGib so that two of them fit side by side",
            highlight=False,
            soft_wrap=True,
        )
    if not 0 < port < 65536 or not _port_free(port):
        console.print(
            f"[red]folio up:[/] port {port} is not available; pass another --port",
            highlight=False,
            soft_wrap=True,
        )
        return 1

    d = StateDir(state_dir)
    try:
        d.lock()
        saved = d.load()
    except StateError as exc:
        console.print(f"[red]folio up:[/] {exc}", highlight=False, soft_wrap=True)
        d.unlock()
        return 1
    try:
        if saved is None:
            saved = SavedState(manifest=manifest)
        elif saved.manifest.name != manifest.name:
            console.print(
                f"[red]folio up:[/] the state folder {d.root} belongs to InferenceService "
                f"{saved.manifest.name!r}; pass another --state-dir for {manifest.name!r}",
                highlight=False,
            )
            return 1
        else:
            console.print(
                f"resuming {manifest.name!r} from {d.root}: stable {saved.status.stable_revision or '-'}, "
                f"canary {saved.status.canary_revision or '-'}",
                highlight=False,
            )
            if saved.manifest.spec != manifest.spec:
                saved.manifest, saved.generation = manifest, saved.generation + 1
        d.save(saved)
        console.print(
            f"folio up: InferenceService {manifest.name!r}, revision {revision_name(manifest.spec)}",
            highlight=False,
        )
        asyncio.run(_serve(d, saved, port, console))
    finally:
        d.clear_control()
        d.unlock()
    return 0


async def _serve(d: StateDir, saved: SavedState, port: int, console: Console) -> None:
    runtime = LocalRuntime(d, saved, port=port, console=console)
    server, sock, url, token = make_server(runtime)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signame: str) -> None:
        if stop.is_set():  # the second Ctrl-C: do not wait for in-flight requests
            console.print(f"{signame} again: stopping without draining", highlight=False, soft_wrap=True)
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


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
