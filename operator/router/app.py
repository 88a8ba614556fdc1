"""The router's HTTP face: its own /health, /ready, /metrics, and the OpenAI pass-through.

Served by aiohttp on both sides: its C parser and its habit of sending headers together with the
first body chunk halve the per-request cost against uvicorn + h11 (see bench/router.py), and
every microsecond here is added to every request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from functools import partial

import aiohttp
from aiohttp import web

from folio.engine.rules import DEFAULT_MAX_REQUEST_BODY_BYTES, PRIORITY_HEADER
from folio.engine.server.continuation import RESUME_FIELD
from folio.engine.server.openai_errors import ErrorCode, body_too_large_message
from folio.operator.router.admission import RETRY_AFTER_S as SHED_RETRY_AFTER_S
from folio.operator.router.admission import Admission, Shed
from folio.operator.router.affinity import affinity_key
from folio.operator.router.errors import error_response
from folio.operator.router.health import HealthChecker
from folio.operator.router.loadscrape import LoadScraper
from folio.operator.router.metrics import RouterMetrics
from folio.operator.router.model_list import served_models
from folio.operator.router.proxy import DROP_REQUEST_HEADERS, Proxy, ProxyRequest
from folio.operator.router.secrets import SecretReader
from folio.operator.router.sources import ConfigSource
from folio.operator.router.state import RoutingState
from folio.operator.router.tenants import ENGINE_PRIORITY_HEADER, Meter
from folio.operator.serving.router import RouterConfig

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

TENANTS_PATH = "/folio/v1/tenants"  # each tenant's usage (`usage.TenantUsage`)

# path -> (method, may be mirrored to the canary, follows the weighted split)
PROXIED: dict[str, tuple[str, bool, bool]] = {
    "/v1/completions": ("POST", True, True),
    "/v1/chat/completions": ("POST", True, True),
    "/v1/models": ("GET", False, False),  # the same answer from every revision: ask stable
}


class RequestError(Exception):
    def __init__(self, status: int, message: str, code: ErrorCode, param: str | None = None, *,
                 headers: dict[str, str] | None = None, tenant: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.code, self.param = status, code, param
        self.headers, self.tenant = headers, tenant


class RouterApp:
    """One InferenceService's router: config source, health checks and proxy behind an aiohttp app."""

    def __init__(
        self,
        isvc: str,
        source: ConfigSource,
        *,
        api_keys: Iterable[str] = (),
        secrets: SecretReader | None = None,
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
        self.secrets = secrets  # where spec.access's Secret of API keys is read from
        self.usage = self.metrics.tenants  # each tenant's counts (and last minute and hour: `folio status --tenants`)
        self.admission = Admission(self.state, self.metrics)  # tenants' requests while the replicas are saturated
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
        app.router.add_get(TENANTS_PATH, self._tenants)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        app.on_response_prepare.append(_rate_limit_headers)
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
            asyncio.create_task(self._follow_secret(), name="router-secret"),
        ]

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.admission.close()
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

    async def _follow_secret(self, poll_s: float = 0.5) -> None:
        """Follows the Secret of API keys the access in force names, another when it names another."""
        following: tuple[str, asyncio.Task[None]] | None = None
        try:
            while True:
                name = self.state.secret_name
                if following is not None and following[0] != name:
                    following[1].cancel()
                    following = None
                if following is None and name is not None:
                    if self.secrets is None:
                        self.state.set_secret(name, None)  # nowhere to read it: no key is accepted
                    else:
                        deliver = partial(self.state.set_secret, name)
                        following = (name, asyncio.create_task(self.secrets.follow(name, deliver)))
                await asyncio.sleep(poll_s)
        finally:
            if following is not None:
                following[1].cancel()

    def apply(self, config: RouterConfig) -> None:
        self.state.apply(config)
        self.admission.pump()  # new replicas (or slots) may take waiting requests
        if self._proxy is not None:
            self._proxy.hold.pump()  # new replicas may take held requests

    # ----------------------------------------------------------------------------- handlers

    async def _health(self, request: web.Request) -> web.Response:
        body: dict[str, object] = {"status": "ok"}
        problems = [*self.state.config.problems, *self.state.access_problems]
        if problems:  # serving, but without part of its config
            body["configProblems"] = problems
        return web.json_response(body)

    async def _ready(self, request: web.Request) -> web.Response:
        ready, reason = self.state.ready()
        body = {"ready": ready, "reason": reason, "config": self.state.fingerprint,
                "replicas": self.state.balancer.in_rotation()}
        return web.json_response(body, status=200 if ready else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": self.metrics.content_type})

    async def _tenants(self, request: web.Request) -> web.Response:
        """Each tenant's usage over the last minute and hour (no key in it: names and counts only)."""
        return web.json_response({"tenants": self.usage.snapshot(time.monotonic())})

    async def _not_found(self, request: web.Request) -> web.Response:
        return error_response(404, f"no route for {request.path}", code=ErrorCode.NOT_FOUND)

    def _proxied(self, method: str, mirror: bool, use_split: bool) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            assert self._proxy is not None, "the router has not started"
            try:
                proxy_request = await self._admit(request, method, mirror, use_split)
            except RequestError as exc:
                headers = exc.headers
                if exc.status == 405:
                    headers = {"Allow": method}
                elif exc.status == 401:
                    headers = {"WWW-Authenticate": "Bearer"}
                response = error_response(exc.status, str(exc), code=exc.code, param=exc.param, headers=headers)
                if exc.tenant is not None:
                    self._answered(exc.tenant, str(exc.status), 0, 0)
                return response
            meter = proxy_request.meter
            if meter is None:
                # A client that leaves cancels this handler (handler_cancellation), which closes the
                # upstream connection with it, so the engine stops generating for nobody.
                return await self._proxy.forward(proxy_request, request)
            code = "499"  # (nginx's) the client left before its answer began
            ticket = None
            try:
                claim = meter.claim
                ticket = self.admission.try_enter(claim) or await self.admission.enter(claim)
                response = await self._proxy.forward(proxy_request, request)
                code = str(response.status)
                return response
            except Shed as exc:
                code, meter.prompt_tokens, meter.completion_tokens = "503", 0, 0  # it used nothing
                return error_response(503, f"tenant {meter.tenant!r}: {exc}", code=ErrorCode.SERVER_OVERLOADED,
                                      headers={"Retry-After": str(SHED_RETRY_AFTER_S)})  # fmt: skip
            finally:
                if ticket is not None:
                    self.admission.leave(ticket)
                # after its answer is on its way (the loop's next turn, before any other request of the
                # tenant can be read): the answer's usage is read and the tenant's quota and counts settled
                asyncio.get_running_loop().call_soon(self._settle, meter, code)

        return handle

    def _settle(self, meter: Meter, code: str) -> None:
        """A tenant's request ended: its place in flight is free, its tokens settled and counted."""
        if meter.answer is not None:
            meter.read_usage(meter.answer)
        tenants = self.state.tenants
        quota = tenants.quotas.get(meter.tenant) if tenants is not None else None
        now = time.monotonic()
        if quota is not None and quota.in_flight > 0:  # (none: its tenant left the Secret meanwhile)
            quota.settle(meter.reserved, meter.used, now)
        # (a streamed answer shows no prompt count: its estimate stands in, once the answer is there)
        prompt = meter.prompt_tokens if meter.prompt_tokens is not None else meter.prompt_estimate if code == "200" else 0
        self._answered(meter.tenant, code, prompt, meter.completion_tokens or 0, now)

    def _answered(self, tenant: str, code: str, prompt_tokens: int, completion_tokens: int,
                  now: float | None = None) -> None:  # fmt: skip
        self.usage.record(tenant, code, prompt_tokens, completion_tokens, time.monotonic() if now is None else now)

    async def _admit(self, request: web.Request, method: str, mirror: bool, use_split: bool) -> ProxyRequest:
        """Check the request before it costs an upstream anything."""
        if request.method != method:
            raise RequestError(405, f"{request.path} accepts {method} only", ErrorCode.METHOD_NOT_ALLOWED)
        tenants = self.state.tenants
        tenant: str | None = None
        if tenants is not None:
            tenant = tenants.identify(request.headers.get("Authorization"), request.headers.get("api-key"))
            if tenant is None:
                raise RequestError(401, "missing or invalid API key (send 'Authorization: Bearer KEY' or 'api-key: KEY')",
                                   ErrorCode.INVALID_API_KEY)  # fmt: skip
        elif not self.state.api_keys.allows(request.headers.get("Authorization")):
            raise RequestError(
                401, "missing or invalid API key (send 'Authorization: Bearer KEY')", ErrorCode.INVALID_API_KEY
            )
        try:
            body, parsed = await _read(request, method, self.max_body_bytes)
        except RequestError as exc:
            exc.tenant = tenant  # a tenant's bad request is metered as its own
            raise
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in DROP_REQUEST_HEADERS]
        meter = None
        if tenant is not None and method == "POST":
            assert tenants is not None
            meter = self._reserve(request, tenant, body, parsed)
            meter.priority = tenants.policy(tenant).priority
            engine_priority = ENGINE_PRIORITY_HEADER.get(meter.priority)
            if engine_priority is not None:  # (a Standard request is the engines' default: nothing to say)
                headers.append((PRIORITY_HEADER, engine_priority))
        balancer = self.state.balancer
        key = affinity_key(parsed, headers, balancer.settings.prefix_char_length) if balancer.by_prefix else None
        admitted = ProxyRequest(method, request.path_qs, headers, body, mirror=mirror, use_split=use_split,
                                affinity=key, parsed=parsed if method == "POST" else None, meter=meter)
        if request.path == "/v1/models" and self.state.adapters:
            return replace(admitted, rewrite=partial(served_models, adapters=frozenset(self.state.adapters)))
        adapter = self.state.adapter(parsed.get("model")) if method == "POST" else None
        return admitted if adapter is None else admitted.under(adapter)


    def _reserve(self, request: web.Request, tenant: str, body: bytes, parsed: dict[str, object]) -> Meter:
        """Takes the request's share of its tenant's quota, or refuses it (429 with when to try again)."""
        tenants = self.state.tenants
        assert tenants is not None
        quota = tenants.quotas[tenant]
        meter = Meter.reserve(tenant, request.path, body, parsed)
        now = time.monotonic()
        refusal = quota.refusal(meter.reserved, now)
        if refusal is None:
            quota.admit(meter.reserved)
        request[RATE_LIMIT_HEADERS] = quota.headers(now)  # on its answer, whichever it is
        if refusal is not None:
            raise RequestError(429, f"tenant {tenant!r}: {refusal.message}; retry after "
                               f"{math.ceil(refusal.retry_after)}s", ErrorCode.RATE_LIMIT_EXCEEDED,
                               headers={"Retry-After": str(max(1, math.ceil(refusal.retry_after)))},
                               tenant=tenant)  # fmt: skip
        return meter


async def _read(request: web.Request, method: str, max_body_bytes: int) -> tuple[bytes, dict[str, object]]:
    """The body, and its JSON object (POST; empty for GET), or the 4xx saying what is wrong with it."""
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(413, body_too_large_message(max_body_bytes), ErrorCode.BODY_TOO_LARGE) from None
    parsed = _check_json_object(body) if method == "POST" else {}
    if RESUME_FIELD in parsed:  # the router's own field, for continuing an answer (`migration`)
        raise RequestError(400, f"'{RESUME_FIELD}' is not a request parameter", ErrorCode.INVALID_VALUE,
                           param=RESUME_FIELD)
    return body, parsed


RATE_LIMIT_HEADERS = web.RequestKey("folio_rate_limit_headers", list)


async def _rate_limit_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer to a tenant with limits carries OpenAI's x-ratelimit-* headers."""
    headers = request.get(RATE_LIMIT_HEADERS)
    if headers:
        response.headers.update(headers)


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
