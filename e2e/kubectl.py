"""Small helpers for the end-to-end tests: kubectl and helm as subprocesses, port-forwards, router counts.

The tests drive a real cluster exactly as a user would, with the same binaries (`make tools` puts
helm and kubectl in `.venv/tools/bin`; `FOLIO_KUBECTL`/`FOLIO_HELM` or PATH may point elsewhere).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx

from folio.operator.analysis.windows import parse_router_metrics
from tests.support.wait import wait_for as _wait_for

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")
Obj = dict[str, Any]


def find_tool(name: str) -> str | None:
    for candidate in (os.environ.get(f"FOLIO_{name.upper()}"), str(REPO / ".venv" / "tools" / "bin" / name)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name)


class CommandError(RuntimeError):
    pass


def run(cmd: list[str], *, input: str | None = None, timeout: float = 300, check: bool = True) -> str:
    proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise CommandError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


class Kubectl:
    """kubectl bound to one namespace."""

    def __init__(self, binary: str, namespace: str) -> None:
        self.binary = binary
        self.namespace = namespace

    def __call__(self, *args: str, input: str | None = None, timeout: float = 300, check: bool = True) -> str:
        return run([self.binary, "-n", self.namespace, *args], input=input, timeout=timeout, check=check)

    def get(self, kind: str, name: str) -> Obj:
        return json.loads(self("get", kind, name, "-o", "json"))

    def apply(self, *objects: Obj) -> None:
        """Server-side apply, as Argo CD and Flux do."""
        body = "\n---\n".join(json.dumps(o) for o in objects)
        self("apply", "--server-side", "--force-conflicts", "--field-manager=folio-e2e", "-f", "-", input=body)

    def events(self, involved: str) -> list[Obj]:
        out = self("get", "events", "--field-selector", f"involvedObject.name={involved}", "-o", "json")
        return json.loads(out)["items"]

    @contextmanager
    def port_forward(self, target: str, port: int) -> Iterator[str]:
        """`kubectl port-forward` on a free loopback port; yields the base URL."""
        proc = subprocess.Popen(
            [self.binary, "-n", self.namespace, "port-forward", "--address", "127.0.0.1", target, f":{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # "Forwarding from 127.0.0.1:PORT -> 8080"
            match = re.search(r"127\.0\.0\.1:(\d+)", line)
            if not match:
                raise CommandError(f"port-forward {target} failed: {line}{proc.stderr.read() if proc.stderr else ''}")
            yield f"http://127.0.0.1:{match.group(1)}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 3.0) -> T:
    """Poll `probe` until it returns something truthy; a failing kubectl or HTTP call means "not yet"."""
    return _wait_for(probe, timeout, what, interval, ignore=(CommandError, httpx.HTTPError, KeyError))


def condition(obj: Obj, type_: str) -> Obj:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def chat(base_url: str, model: str, content: str = "Say hello.", max_tokens: int = 8) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0}
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)


def router_counts(base_url: str, isvc: str) -> dict[tuple[str, str], float]:
    """The router's upstream attempts by (revision, code), scraped and read as the analysis reads them."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return {(rev, code): n for rev, w in parse_router_metrics(text, isvc).items() for code, n in w.codes.items()}


class Load:
    """Chat completions through the router from a background thread, so a canary gets analysed."""

    def __init__(self, base_url: str, model: str) -> None:
        self.base_url, self.model = base_url, model
        self.codes: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as client:
            body = {"model": self.model, "messages": [{"role": "user", "content": "Count to three."}],
                    "max_tokens": 4, "temperature": 0}
            while not self._stop.is_set():
                try:
                    code = client.post(f"{self.base_url}/v1/chat/completions", json=body).status_code
                except httpx.HTTPError:
                    code = 0
                self.codes[code] = self.codes.get(code, 0) + 1
                self._stop.wait(0.2)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=150)
