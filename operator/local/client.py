"""Talking to a running `folio up` through the control endpoint recorded in its state folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from folio.operator.local.state import StateDir


class ControlError(RuntimeError):
    """The running `folio up` refused a request or could not be reached; the message says why."""


class LocalClient:
    def __init__(self, url: str, token: str, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._headers = {"authorization": f"Bearer {token}"}
        self._timeout = timeout

    @classmethod
    def find(cls, state_dir: str | Path) -> LocalClient | None:
        """The client for the `folio up` holding ``state_dir``, or None when none runs there."""
        d = StateDir(state_dir)
        if not d.root.is_dir() or not d.is_locked():
            return None  # a control.json left by a killed `folio up` is stale
        control = d.read_control()
        if control is None:
            return None
        return cls(str(control["url"]), str(control.get("token", "")))

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/v1/status")

    def apply(self, manifest: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/apply", json={"manifest": manifest})

    def override(self, name: str, adapter: str | None = None) -> dict[str, Any]:
        """Ask for ``name`` (promote, abort, retry) on the service's rollout, or on ``adapter``'s."""
        return self._call("POST", f"/v1/overrides/{name}", params={"adapter": adapter} if adapter else None)

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            resp = httpx.request(
                method,
                self.url + path,
                headers=self._headers,
                timeout=self._timeout,
                trust_env=False,
                **kwargs,
            )
        except httpx.HTTPError as exc:
            raise ControlError(f"cannot reach `folio up` at {self.url}: {exc}") from None
        try:
            body = resp.json()
        except ValueError:
            body = {}
        if resp.status_code >= 400:
            message = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
            raise ControlError(message or f"`folio up` answered HTTP {resp.status_code}")
        return body
