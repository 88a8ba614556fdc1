"""Driving a real `folio up` from Python, as a user would: `make demo` and the end-to-end tests.

- `write_manifest` writes an InferenceService for a local model (a path, or a ``pkg://`` URL) with its digest
  (and adapters);
- `UpProcess` runs `folio up` as a child, waits for its control endpoint and stops it the way a
  user does (SIGINT), checking that every process it started is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import yaml

from folio.operator.local.client import ControlError, LocalClient
from folio.operator.spec import API_VERSION, KIND
from folio.operator.testing.wait import WaitTimeout, wait_for


def write_manifest(
    path: Path,
    *,
    name: str,
    model: Path | str,
    digest: str,
    args: dict[str, Any] | None = None,
    replicas: int = 1,
    rollout: dict[str, Any] | None = None,
    served_name: str | None = None,
    router: dict[str, Any] | None = None,
    autoscaling: dict[str, Any] | None = None,
    adapters: list[dict[str, Any]] | None = None,
    access: dict[str, Any] | None = None,
    draft_model: dict[str, Any] | None = None,
) -> Path:
    doc = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "model": {
                "source": model if isinstance(model, str) else f"file://{model.resolve()}",
                "digest": digest,
                "servedName": served_name or name,
            },
            "replicas": replicas,
            "engine": {"args": args or {}},
            "rollout": rollout or {},
            **({"router": router} if router else {}),
        },
    }
    if autoscaling is not None:
        doc["spec"]["autoscaling"] = autoscaling
    if adapters:
        doc["spec"]["adapters"] = adapters
    if access is not None:
        doc["spec"]["access"] = access
    if draft_model is not None:
        doc["spec"]["draftModel"] = draft_model
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class UpProcess:
    """`folio up FILE --port P --state-dir DIR` as a child process, output in ``log``."""

    def __init__(
        self, manifest: Path, *, port: int, state_dir: Path, log: Path, env: dict[str, str] | None = None
    ):
        self.state_dir, self.port, self.log = state_dir, port, log
        self._log = log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "folio.operator.cli", "up", str(manifest), "--port", str(port),
             "--state-dir", str(state_dir)],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        self.client = self._wait_for_control()

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_for_control(self, timeout: float = 60.0) -> LocalClient:
        def ready() -> LocalClient | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"folio up exited with {self.proc.returncode}; see {self.log}")
            client = LocalClient.find(self.state_dir)
            if client is not None:
                client.status()  # answers: the control endpoint is up
            return client

        return wait_for(ready, timeout, f"folio up's control endpoint (see {self.log})", 0.2, ignore=(ControlError,))

    def status(self) -> dict[str, Any]:
        return self.client.status()

    def wait_for(self, cond: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        """Poll the status snapshot until ``cond`` holds; raises `WaitTimeout` naming ``what``."""
        last: dict[str, Any] = {}

        def holds() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"folio up exited with {self.proc.returncode} waiting for {what}; see {self.log}")
            snap = self.client.status()
            last.clear()
            last.update(snap)
            return snap if cond(snap) else None

        try:
            return wait_for(holds, timeout, what, 0.25, ignore=(ControlError,))
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}; last status {last.get('status')}; see {self.log}") from None

    def child_pids(self) -> list[int]:
        with contextlib.suppress(psutil.NoSuchProcess):
            return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        return []

    def stop(self, timeout: float = 60.0, sig: signal.Signals = signal.SIGINT) -> int:
        """SIGINT (as Ctrl-C does) or ``sig``; returns the exit code and raises if a child survived."""
        children = self.child_pids()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
        left = [pid for pid in children if _alive(pid)]
        if left:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise RuntimeError(f"processes left behind by folio up: {left}")
        return code

    def kill(self) -> list[int]:
        """SIGKILL `folio up` itself (a crash); returns the children it had."""
        children = self.child_pids()
        self.proc.kill()
        self.proc.wait()
        self._log.close()
        return children


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until none of ``pids`` runs; returns those still running at the deadline."""
    with contextlib.suppress(WaitTimeout):
        wait_for(lambda: not any(_alive(p) for p in pids), timeout, "the processes gone", 0.1)
    return [p for p in pids if _alive(p)]
