"""The control endpoint of a running `folio up`: loopback HTTP with a bearer token.

`folio apply|status|promote|abort|retry` find it through ``control.json`` in the state folder
(written with mode 0600, so only the user who started `folio up` can steer it).

    GET  /v1/status              the service's spec, status and processes
    POST /v1/apply               {"manifest": {...}}: a new spec (a new revision starts a canary)
    POST /v1/overrides/{name}    promote | abort | retry

Errors are ``{"error": {"message": ...}}``; a refused manifest's message has one line per problem
(``<field path>: <what is wrong>``, as `folio.operator.serving.validate` words them), and the error
also lists them as ``problems`` ([{path, reason, message}]).
"""

from __future__ import annotations

import contextlib
import secrets
import socket
from typing import TYPE_CHECKING, Any

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from folio.operator.rollout.types import OVERRIDES
from folio.operator.serving.validate import THIS_MACHINE, Problem, parse_manifest
from folio.operator.spec import InferenceService

if TYPE_CHECKING:
    from folio.operator.local.runtime import LocalRuntime


class Refused(HTTPException):
    """400 for a manifest with problems: one line each in the message, and the list itself."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__(400, "\n".join(str(p) for p in problems))
        self.problems = problems


def check_apply(body: object) -> InferenceService:
    """The manifest of an apply request's body, valid for `folio up`; raises HTTPException (400) saying why not."""
    manifest = body.get("manifest") if isinstance(body, dict) else None
    if manifest is None:
        raise HTTPException(400, 'invalid manifest: the body must be {"manifest": {...}}')
    parsed, problems = parse_manifest(manifest, THIS_MACHINE)
    if problems or parsed is None:
        raise Refused(problems)
    return parsed


def build_app(runtime: LocalRuntime, token: str) -> FastAPI:
    def authorized(request: Request) -> None:
        if not secrets.compare_digest(request.headers.get("authorization", ""), f"Bearer {token}"):
            raise HTTPException(401, "missing or wrong control token (see control.json in the state folder)")

    app = FastAPI(title="folio up control", dependencies=[Depends(authorized)])

    @app.exception_handler(HTTPException)
    async def _error(_request: Request, exc: HTTPException) -> JSONResponse:
        error: dict[str, Any] = {"message": str(exc.detail)}
        if isinstance(exc, Refused):
            error["problems"] = [{"path": p.path, "reason": p.reason, "message": p.message} for p in exc.problems]
        return JSONResponse({"error": error}, status_code=exc.status_code)

    @app.get("/v1/status")
    async def status() -> dict[str, Any]:
        return runtime.snapshot()

    @app.post("/v1/apply")
    async def apply(request: Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError as exc:
            raise HTTPException(400, f"invalid manifest: the body is not JSON ({exc})") from None
        manifest = check_apply(body)
        try:
            return runtime.apply(manifest)  # checks the name, and validates again
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None

    @app.post("/v1/overrides/{override}", status_code=202)
    async def override(override: str, adapter: str | None = None) -> dict[str, Any]:
        if override not in OVERRIDES:
            raise HTTPException(404, f"unknown override {override!r}; use one of {', '.join(OVERRIDES)}")
        if adapter is not None:  # one adapter's rollout (`folio.operator.rollout.adapters`)
            names = [a.name for a in runtime.spec.adapters]
            if adapter not in names:
                raise HTTPException(404, f"no adapter {adapter!r} in the spec; it serves {', '.join(names) or 'none'}")
            runtime.request_override(f"{override}@{adapter}")
            return {"override": override, "adapter": adapter, "accepted": True}
        runtime.request_override(override)
        return {"override": override, "accepted": True}

    return app


def make_server(runtime: LocalRuntime) -> tuple[uvicorn.Server, socket.socket, str, str]:
    """A uvicorn server on a free loopback port; returns it, its socket, its URL and the token."""
    token = secrets.token_urlsafe(24)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(build_app(runtime, token), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]  # `folio up` owns signals
    return server, sock, url, token
