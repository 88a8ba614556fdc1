"""Driving a real `folio up` from Python: the demo and the end-to-end tests share this.

- `write_manifest` writes an InferenceService for a ``file://`` model with its digest;
- `UpProcess` runs `folio up` as a child, waits for its control endpoint and stops it the way a
  user does (SIGINT), checking that every process it started is gone;
- `LoadGenerator` keeps a steady chat load on the router with the official `openai` client
  (its own retries off, so every failure the router lets through is counted).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from folio.operator.local.client import ControlError, LocalClient


def write_manifest(
    path: Path,
    *,
    name: str,
    model: Path,
    digest: str,
    args: dict[str, Any] | None = None,
    replicas: int = 1,
    rollout: dict[str, Any] | None = None,
    served_name: str | None = None,
) -> Path:
    doc = {
        "apiVersion": "serving.folio.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "source": f"file://{model.resolve()}",
                "digest": digest,
                "servedName": served_name or name,
            },
            "replicas": replicas,
            "engine": {"args": args or {}},
            "rollout": rollout or {},
        },
    }
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"folio up exited with {self.proc.returncode}; see {self.log}")
            client = LocalClient.find(self.state_dir)
            if client is not None:
                with contextlib.suppress(ControlError):
                    client.status()
                    return client
            time.sleep(0.2)
        raise TimeoutError(
            f"folio up did not open its control endpoint within {timeout:.0f}s; see {self.log}"
        )

    def status(self) -> dict[str, Any]:
        return self.client.status()

    def wait_for(self, cond: Callable[[dict[str, Any]], bool], timeout: float, what: str) -> dict[str, Any]:
        """Poll the status snapshot until ``cond`` holds; raises TimeoutError naming ``what``."""
        deadline = time.monotonic() + timeout
        snap: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"folio up exited with {self.proc.returncode} waiting for {what}; see {self.log}"
                )
            with contextlib.suppress(ControlError):
                snap = self.client.status()
                if cond(snap):
                    return snap
            time.sleep(0.25)
        raise TimeoutError(
            f"{what} not reached within {timeout:.0f}s; last status {snap.get('status')}; see {self.log}"
        )

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
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@dataclass
class LoadStats:
    ok: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


class LoadGenerator:
    """``concurrency`` threads sending chat requests back to back until stopped."""

    PROMPTS = (
        "Name a colour.",
        "What is two plus two?",
        "Say hello in French.",
        "Name a planet.",
        "What do bees make?",
    )

    def __init__(self, base_url: str, model: str, *, concurrency: int = 3, max_tokens: int = 8) -> None:
        import openai

        self.client = openai.OpenAI(
            base_url=f"{base_url}/v1", api_key="folio-demo", max_retries=0, timeout=60
        )
        self.model, self.concurrency, self.max_tokens = model, concurrency, max_tokens
        self.stats = LoadStats()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> LoadGenerator:
        for i in range(self.concurrency):
            t = threading.Thread(target=self._run, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def snapshot(self) -> LoadStats:
        with self._lock:
            return LoadStats(
                self.stats.ok, self.stats.failed, list(self.stats.errors), list(self.stats.latencies)
            )

    def _run(self, worker: int) -> None:
        import openai

        n = worker
        while not self._stop.is_set():
            prompt = self.PROMPTS[n % len(self.PROMPTS)]
            n += 1
            start = time.monotonic()
            try:
                self.client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=self.max_tokens,
                    temperature=0.0,
                )
            except openai.OpenAIError as exc:
                with self._lock:
                    self.stats.failed += 1
                    self.stats.errors.append(f"{type(exc).__name__}: {exc}")
            else:
                with self._lock:
                    self.stats.ok += 1
                    self.stats.latencies.append(time.monotonic() - start)
