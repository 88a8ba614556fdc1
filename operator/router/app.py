"""The router's HTTP face: its own /health, /ready, /metrics, and the OpenAI pass-through.

Served by aiohttp on both sides: its C parser and its habit of sending headers together with the
first body chunk halve the per-request cost against uvicorn + h11 (see bench/router.py), and
every microsecond here is added to every request.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from functools import partial

import aiohttp
from aiohttp import web

from folio.engine.rules import DEFAULT_MAX_REQUEST_BODY_BYTES
from folio.engine.server.continuation import RESUME_FIELD
from folio.engine.server.openai_errors import ErrorCode, body_too_large_message
from folio.operator.router.affinity import affinity_key
from folio.operator.router.errors import error_response
from folio.operator.router.health import HealthChecker
from folio.operator.router.loadscrape import LoadScraper
from folio.operator.router.metrics import RouterMetrics
from folio.operator.router.model_list import served_models
from folio.operator.router.proxy import DROP_REQUEST_HEADERS, Proxy, ProxyRequest
from folio.operator.router.sources import ConfigSource
from folio.operator.router.state import RoutingState
from folio.operator.serving.router import RouterConfig

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# path -> (method, may be mirrored to the canary, follows the weighted split)
PROXIED: dict[str, tuple[str, bool, bool]] = {
    "/v1/completions": ("POST", True, True),
    "/v1/chat/completions": ("POST", True, True),
    "/v1/models": ("GET", False, False),  # the same answer from every revision: ask stable
}


class RequestError(Exception):
    def __init__(self, status: int, message: str, code: ErrorCode, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param


class RouterApp:
    """One InferenceService's router: config source, health checks and proxy behind an aiohttp app."""

    def __init__(
        self,
        isvc: str,
        source: ConfigSource,
        *,
        api_keys: Iterable[str] = (),
        health_path: str = "/health",
        health_interval: float = 2.0,
        health_timeout: float = 2.0,
        connect_timeout: float = 3.0,
        read_timeout: float = 600.0,
        max_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,  # the engine's default too (one limit)
    ) -> None:
        self.isvc = isvc
        self.max_body_bytes = max_body_bytes
        self.source = source
        self.metrics = RouterMetrics(isvc)
        self.state = RoutingState(self.metrics, api_keys)
        self._health_opts = {"path": health_path, "interval": health_interval, "timeout": health_timeout}
        self._timeouts = {"connect_timeout": connect_timeout, "read_timeout": read_timeout}
        self._session: aiohttp.ClientSession | None = None
        self._proxy: Proxy | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def web_app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes)
        for path, (method, mirror, use_split) in PROXIED.items():
            app.router.add_route("*", path, self._proxied(method, mirror, use_split))
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        app.on_startup.append(lambda _: self.startup())
        app.on_cleanup.append(lambda _: self.shutdown())
        return app

    # ---------------------------------------------------------------------------- lifecycle

    async def startup(self) -> None:
        self._session = aiohttp.ClientSession(
            # No pool limit (the engines queue for themselves); idle connections are dropped before
            # a uvicorn upstream's 5 s keep-alive closes them, so a reused connection is never dead.
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
            auto_decompress=False,  # relay bytes exactly as the upstream encoded them
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
        )
        # A source that can ask for a scale up is asked when requests are held (neither built-in one can:
        # the held-requests gauge on /metrics is their ask, read by the operator or `folio up`).
        self._proxy = Proxy(self.state, self.metrics, self._session, **self._timeouts,
                            ask_scale_up=getattr(self.source, "ask_scale_up", None))
        health = HealthChecker(self._session, self.state.balancer.replicas, **self._health_opts)
        self._tasks = [
            asyncio.create_task(self._run_source(), name="router-config"),
            asyncio.create_task(health.run(), name="router-health"),
            asyncio.create_task(LoadScraper(self._session, self.state.balancer.replicas).run(), name="router-load"),
        ]

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._proxy is not None:
            await self._proxy.close()
        if self._session is not None:
            await self._session.close()

    async def _run_source(self) -> None:
        try:
            await self.source.run(self.apply)
        except asyncio.CancelledError:
            raise
        except Exception:  # a source bug must show, not silently freeze the config
            log.exception("config source %s stopped", type(self.source).__name__)
            raise

    def apply(self, config: RouterConfig) -> None:
        self.state.apply(config)
        if self._proxy is not None:
            self._proxy.hold.pump()  # new replicas may take held requests

    # ----------------------------------------------------------------------------- handlers

    async def _health(self, request: web.Request) -> web.Response:
        body: dict[str, object] = {"status": "ok"}
        if self.state.config.problems:  # serving, but without part of its config
            body["configProblems"] = list(self.state.config.problems)
        return web.json_response(body)

    async def _ready(self, request: web.Request) -> web.Response:
        ready, reason = self.state.ready()
        body = {"ready": ready, "reason": reason, "config": self.state.fingerprint,
                "replicas": self.state.balancer.in_rotation()}
        return web.json_response(body, status=200 if ready else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type})

    async def _not_found(self, request: web.Request) -> web.Response:
        return error_response(404, f"no route for {request.path}", code=ErrorCode.NOT_FOUND)

    def _proxied(self, method: str, mirror: bool, use_split: bool) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            assert self._proxy is not None, "the router has not started"
            try:
                proxy_request = await self._admit(request, method, mirror, use_split)
            except RequestError as exc:
                headers = {"Allow": method} if exc.status == 405 else None
                if exc.status == 401:
                    headers = {"WWW-Authenticate": "Bearer"}
                return error_response(exc.status, str(exc), code=exc.code, param=exc.param, headers=headers)
            # A client that leaves cancels this handler (handler_cancellation), which closes the
            # upstream connection with it, so the engine stops generating for nobody.
            return await self._proxy.forward(proxy_request, request)

        return handle

    async def _admit(self, request: web.Request, method: str, mirror: bool, use_split: bool) -> ProxyRequest:
        """Check the request before it costs an upstream anything."""
        if request.method != method:
            raise RequestError(405, f"{request.path} accepts {method} only", ErrorCode.METHOD_NOT_ALLOWED)
        if not self.state.api_keys.allows(request.headers.get("Authorization")):
            raise RequestError(
                401, "missing or invalid API key (send 'Authorization: Bearer KEY')", ErrorCode.INVALID_API_KEY
            )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise RequestError(
                413, body_too_large_message(self.max_body_bytes), ErrorCode.BODY_TOO_LARGE
            ) from None
        parsed = _check_json_object(body) if method == "POST" else {}
        if RESUME_FIELD in parsed:  # the router's own field, for continuing an answer (`migration`)
            raise RequestError(400, f"'{RESUME_FIELD}' is not a request parameter", ErrorCode.INVALID_VALUE,
                               param=RESUME_FIELD)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in DROP_REQUEST_HEADERS]
        balancer = self.state.balancer
        key = affinity_key(parsed, headers, balancer.settings.prefix_char_length) if balancer.by_prefix else None
        admitted = ProxyRequest(method, request.path_qs, headers, body, mirror=mirror, use_split=use_split,
                                affinity=key, parsed=parsed if method == "POST" else None)
        if request.path == "/v1/models" and self.state.adapters:
            return replace(admitted, rewrite=partial(served_models, adapters=frozenset(self.state.adapters)))
        adapter = self.state.adapter(parsed.get("model")) if method == "POST" else None
        return admitted if adapter is None else admitted.under(adapter)


def _check_json_object(body: bytes) -> dict[str, object]:
    if not body:
        raise RequestError(400, "request body is empty; expected a JSON object", ErrorCode.INVALID_JSON)
    try:
        parsed = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}", ErrorCode.INVALID_JSON) from None
    if not isinstance(parsed, dict):
        raise RequestError(
            400, f"request body must be a JSON object, got {type(parsed).__name__}", ErrorCode.INVALID_JSON
        )
    return parsed
