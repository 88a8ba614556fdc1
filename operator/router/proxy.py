"""Forwarding one request: pick a revision and replica, retry to stable, overflow, mirror, relay.

Only a failure before the first byte can be retried: after that the client has the status line. An
event-stream answer is relayed by `migration.Answer` (whole events, the engine's records taken out), and
one that breaks off after its first byte is continued on another replica (`migration.carry_on`) or ended
cleanly. Every upstream attempt is counted once, under the revision that answered (or failed to), and
is held to a timeout (`timeouts`): until its first byte, then between chunks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from time import perf_counter
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from folio.engine.rules import PRIORITY_HEADER
from folio.engine.server.continuation import CREATED_HEADER, RESPONSE_ID_HEADER, RESUMABLE_HEADER
from folio.engine.server.openai_errors import ErrorCode
from folio.operator.router.balancer import Replica
from folio.operator.router.errors import error_response
from folio.operator.router.hold import RETRY_AFTER_S, AskScaleUp, HoldQueue
from folio.operator.router.metrics import NO_ADAPTER, Adapter, RouterMetrics
from folio.operator.router.migration import (
    RESUMABLE,
    UPSTREAM_ERRORS,
    Answer,
    Seam,
    carry_on,
    resumable_answer,
    write,
)
from folio.operator.router.outliers import is_failure
from folio.operator.router.shadow_compare import Capture, Comparison, comparable
from folio.operator.router.state import RoutingState
from folio.operator.router.tenants import Meter
from folio.operator.router.timeouts import (
    TIMEOUT,
    Stalled,
    attempt_timeout,
    next_chunk,
    timed_out_response,
)
from folio.operator.serving.adapters import engine_name
from folio.operator.serving.router import OVERFLOW, Overflow

log = logging.getLogger(__name__)

_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade",
}  # fmt: skip
# The router's own credentials never travel upstream; aiohttp computes the length itself.
# A client's X-Folio-Resumable is not its to send: the router asks for records itself (`migration`).
DROP_REQUEST_HEADERS = frozenset({
    *_HOP_BY_HOP, "host", "content-length", "authorization", "api-key", "expect", RESUMABLE_HEADER.lower(),
    PRIORITY_HEADER.lower(),  # the router's to set, from the tenant (`tenants`)
})  # fmt: skip
# The only request headers the overflow endpoint (a remote service, outside the cluster and its trust)
# gets from a client: what OpenAI's API documents as request headers, plus the body's type and the
# request id for tracing. Cookies, the client's Authorization and any custom header (they may carry
# credentials or identities meant for Folio or a gateway before it) stay here; the Authorization it gets
# is the overflow's own API key, when one is configured. Folio's engines get all but DROP_REQUEST_HEADERS.
OVERFLOW_REQUEST_HEADERS = frozenset({
    "content-type", "accept", "x-request-id", "x-client-request-id",
    "openai-organization", "openai-project", "openai-beta",
})  # fmt: skip
# The router's server writes its own date and server headers; the engine's resume headers are the router's.
_DROP_RESPONSE_HEADERS = frozenset({
    *_HOP_BY_HOP, "date", "server", RESUMABLE_HEADER.lower(), RESPONSE_ID_HEADER.lower(), CREATED_HEADER.lower(),
})  # fmt: skip
NO_UPSTREAM_RETRY_AFTER = "2"
WHOLE_BODY_MAX = 256 * 1024  # answers up to this size with a known length are relayed in one piece


@dataclass
class ProxyRequest:
    method: str
    path: str  # with the query string
    headers: list[tuple[str, str]]  # already stripped of hop-by-hop and auth headers
    body: bytes
    mirror: bool = False  # may be shadowed to the canary
    use_split: bool = True  # False: always the stable revision (e.g. /v1/models)
    affinity: str | None = None  # the prefix or session key placement follows (`affinity.affinity_key`)
    parsed: dict[str, Any] | None = None  # the JSON body of a completion or chat request: it may be continued
    adapter: Adapter = NO_ADAPTER  # (adapter, its revision) the request's model named, for the metrics
    rewrite: Callable[[bytes], bytes] | None = None  # applied to a whole (not streamed) successful answer
    meter: Meter | None = None  # a tenant's request: the usage its answer shows settles its quota

    @property
    def streamed(self) -> bool:
        return self.parsed is not None and bool(self.parsed.get("stream"))

    @property
    def engine_model(self) -> str | None:
        """The adapter revision it runs under, as engines name it (None: the base model)."""
        return engine_name(*self.adapter) if self.adapter != NO_ADAPTER else None

    def under(self, adapter: Adapter) -> ProxyRequest:
        """The request sent to one revision of the adapter its ``model`` names: engines know each adapter revision
        by a name of its own (`folio.operator.serving.adapters.engine_name`) and answer under the adapter's."""
        assert self.parsed is not None, "only a completion or chat request names a model"
        parsed = {**self.parsed, "model": engine_name(*adapter)}
        return replace(self, body=json.dumps(parsed).encode(), parsed=parsed, adapter=adapter)


@dataclass
class Head:
    """What an answer sent first: its whole body (``chunks`` None), or its first chunk and the rest."""

    first: bytes | None  # None: the stream ended without a byte
    chunks: AsyncIterator[bytes] | None = None


@dataclass
class Failure:
    """An attempt whose answer is not relayed (yet): kept in case it is the last one."""

    code: str
    status: int | None = None
    headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    body: bytes = b""
    reason: str = ""

    @property
    def busy(self) -> bool:
        return self.status in (429, 503)

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status >= 500


class Proxy:
    def __init__(
        self,
        state: RoutingState,
        metrics: RouterMetrics,
        session: aiohttp.ClientSession,
        *,
        connect_timeout: float = 3.0,
        read_timeout: float = 600.0,
        shadow_limit: int = 64,
        ask_scale_up: AskScaleUp | None = None,
    ) -> None:
        self.state = state
        self.metrics = metrics
        self._session = session
        # sock_read bounds the wait for headers and between chunks: a long generation is fine
        # as long as it keeps streaming or answers within the limit.
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout, sock_read=read_timeout
        )
        # Attempts keep time themselves (`timeouts.attempt_timeout`): a canary gets less than stable.
        self._read_timeout = read_timeout
        self._attempt_timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)
        self._shadow_limit = shadow_limit
        self._shadow_tasks: set[asyncio.Task[None]] = set()
        self.hold = HoldQueue(state, metrics, ask_scale_up)

    async def forward(self, req: ProxyRequest, downstream: web.Request) -> web.StreamResponse:
        if self.hold.must_wait():  # nothing ready (scaled to zero), or others are held already
            return await self._held(req, downstream)
        return await self._route(req, downstream, hold_unreachable=True)

    async def _held(self, req: ProxyRequest, downstream: web.Request) -> web.StreamResponse:
        return await self.hold.run(lambda: self._route(req, downstream),
                                   lambda why: self._unheld(req, downstream, why),
                                   req.meter.claim if req.meter is not None else None)

    async def _unheld(self, req: ProxyRequest, downstream: web.Request, why: str) -> web.StreamResponse:
        """A request the hold queue could not keep: overflow when configured, else 503 and when to retry."""
        if self.state.config.overflow is not None:
            return await self._overflow(req, downstream, self.state.config.overflow)
        return error_response(503, f"no replica is ready: {why}", code=ErrorCode.NO_READY_REPLICA,
                              headers={"Retry-After": str(RETRY_AFTER_S)})

    async def _route(
        self, req: ProxyRequest, downstream: web.Request, *, hold_unreachable: bool = False
    ) -> web.StreamResponse:
        """Place the request and relay the answer; ``hold_unreachable``: a request whose replicas all
        turned out gone (a scale to zero the config has not shown yet) is held instead of failed."""
        state = self.state
        config, balancer = state.config, state.balancer
        stable = config.stable
        primary = state.split.choose() if req.use_split else stable
        # A revision with nothing ready yet (or all ejected) must not fail requests others could serve.
        replica = balancer.pick(primary, key=req.affinity, adapter=req.engine_model) or balancer.pick_any([stable],
                                                                                                        exclude=())
        comparison = self._maybe_shadow(req, replica.revision) if req.mirror and replica is not None else None
        capture = comparison.primary if comparison is not None else None

        tried: list[Replica] = []
        retried = False
        failure: Failure | None = None
        # With migration on, completions and chat ask the engine for records, so that they can be continued.
        headers = [*req.headers, RESUMABLE] if self._resumable(req) else None
        while replica is not None:
            answer = await self._attempt(
                req, downstream, replica.url, replica.revision, replica, headers=headers, capture=capture
            )
            if isinstance(answer, Seam):  # broke off after its first byte: continued elsewhere, or ended cleanly
                tried.append(replica)
                answer = await self._carry_on(req, downstream, answer, tried)
            if not isinstance(answer, Failure):
                if comparison is not None:  # the whole answer has been relayed: the shadow's may be compared
                    comparison.finish_primary(answer.status)
                return answer
            failure = answer
            tried.append(replica)
            following: Replica | None = None
            if failure.busy and config.overflow is not None:
                # Overflow is for when the whole local fleet is saturated: try every replica first.
                following = balancer.pick_any([stable, primary], exclude=tried)
            elif failure.retryable and not retried:
                retried = True
                back = state.adapter_stable(req.adapter)
                if back is not None:  # a failing adapter revision: its stable one, on the same replica if need be
                    req = req.under(back)
                following = balancer.pick(stable, exclude=tried, adapter=req.engine_model)
                if following is None and back is not None:
                    following = balancer.pick(stable, adapter=req.engine_model)
            if following is None:
                break
            self.metrics.retry(replica.revision, following.revision)
            replica = following

        if config.overflow is not None and (failure is None or failure.busy):
            if failure is not None and tried:
                self.metrics.retry(tried[-1].revision, OVERFLOW)
            return await self._overflow(req, downstream, config.overflow)
        if failure is None:
            return error_response(
                503, "no upstream replica is available", code=ErrorCode.NO_UPSTREAM,
                headers={"Retry-After": NO_UPSTREAM_RETRY_AFTER},
            )  # fmt: skip
        if failure.status is not None:  # the last replica's own answer, as it sent it
            return web.Response(status=failure.status, body=failure.body, headers=failure.headers)
        if failure.code == TIMEOUT:
            return timed_out_response(failure.reason)
        if hold_unreachable and self.hold.must_wait():  # nothing answered and nothing is left ready
            return await self._held(req, downstream)
        return error_response(
            502, f"upstream unreachable: {failure.reason}", code=ErrorCode.UPSTREAM_UNREACHABLE
        )

    def _resumable(self, req: ProxyRequest) -> bool:
        """Whether the request asks the engine for records: a completion or chat one, migration on."""
        return req.parsed is not None and self.state.config.migration.max_attempts > 0

    async def _carry_on(
        self, req: ProxyRequest, downstream: web.Request, seam: Seam, tried: list[Replica]
    ) -> web.StreamResponse:
        headers = [*req.headers, RESUMABLE]

        async def send(replica: Replica, body: bytes) -> web.StreamResponse | Failure | Seam:
            return await self._attempt(replica=replica, req=replace(req, body=body), downstream=downstream,
                                       base_url=replica.url, revision=replica.revision, headers=headers,
                                       answer=seam.answer)

        parsed = req.parsed if self._resumable(req) else None
        return await carry_on(seam, self.state, self.metrics, parsed, tried, send, req.affinity)

    async def _overflow(
        self, req: ProxyRequest, downstream: web.Request, overflow: Overflow
    ) -> web.StreamResponse:
        headers = [(k, v) for k, v in req.headers if k.lower() in OVERFLOW_REQUEST_HEADERS]
        if overflow.api_key:
            headers.append(("Authorization", f"Bearer {overflow.api_key}"))
        answer = await self._attempt(
            req, downstream, overflow.url, OVERFLOW, None, headers=headers, relay_any=True
        )
        if isinstance(answer, Seam):  # no continuing on a remote service: a clean end
            self.metrics.overflowed(answer.code)
            return await answer.answer.fail(answer)
        if isinstance(answer, Failure):
            self.metrics.overflowed(answer.code)
            if answer.code == TIMEOUT:
                return timed_out_response(f"overflow: {answer.reason}")
            return error_response(
                502, f"overflow unreachable: {answer.reason}", code=ErrorCode.UPSTREAM_UNREACHABLE
            )
        self.metrics.overflowed(str(answer.status))
        return answer

    async def _attempt(
        self,
        req: ProxyRequest,
        downstream: web.Request,
        base_url: str,
        revision: str,
        replica: Replica | None,
        *,
        headers: list[tuple[str, str]] | None = None,
        relay_any: bool = False,
        capture: Capture | None = None,
        answer: Answer | None = None,
    ) -> web.StreamResponse | Failure | Seam:
        """One upstream try: the relayed response, why there is none to relay, or (`Seam`) the answer it
        broke off after its first byte. ``answer``: a continuation, which writes on into that answer."""
        metrics = self.metrics
        if replica is not None:
            replica.in_flight += 1
        metrics.attempt_started(revision)
        started = perf_counter()
        limit = attempt_timeout(self.state.config, revision, self._read_timeout)
        code: str | None = None
        resp: aiohttp.ClientResponse | None = None
        try:
            try:
                async with asyncio.timeout(limit):  # the request, the answer's head and its first bytes
                    resp = await self._session.request(
                        req.method, base_url + req.path, data=req.body or None,
                        headers=req.headers if headers is None else headers,
                        timeout=self._attempt_timeout, allow_redirects=False,
                    )  # fmt: skip
                    if answer is not None:  # a continuation: only an answer that carries on will do
                        failed = resp.status != 200 or resumable_answer(resp) is None
                    else:
                        failed = not relay_any and (resp.status >= 500 or resp.status == 429)
                    head = await (_failure(resp, revision) if failed else _head(resp))
            except UPSTREAM_ERRORS as exc:
                if resp is not None:
                    resp.close()
                timed_out = isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ClientError)
                code = TIMEOUT if timed_out else "error"
                if replica is not None:
                    self._outcome(replica, failed=True)
                    if isinstance(exc, aiohttp.ClientConnectorError):
                        replica.mark_down(f"connect failed: {exc}")  # the health checks bring it back
                if timed_out:
                    return Failure(TIMEOUT, reason=f"{revision} sent no answer within {limit:g}s")
                return Failure("error", reason=f"{type(exc).__name__}: {exc}".rstrip(": "))
            code = str(resp.status)
            if replica is not None:
                failed = is_failure(resp.status, "Retry-After" in resp.headers)
                # an adapter canary that answers errors is the adapter's failure (analysis rolls it back), not
                # the replica's: its other answers are fine, and ejecting it would fail everyone else's
                self._outcome(replica, failed=failed and self.state.adapter_stable(req.adapter) is None)
            if isinstance(head, Failure):
                return head
            if head.first is not None:
                metrics.first_byte(revision, perf_counter() - started, req.adapter)
            try:
                broke: str | None = None
                if head.chunks is not None and resp.content_type == "text/event-stream":
                    relayed = await self._relay_events(req, resp, head, revision, downstream, limit, capture, answer)
                    if isinstance(relayed, Seam):
                        broke = relayed.code
                else:
                    relayed, broke = await self._relay(resp, head, revision, downstream, limit, capture, req.rewrite,
                                                       req.meter)  # fmt: skip
            except BaseException:
                resp.close()  # drop the connection so the engine sees the client leave and aborts
                raise
            if broke is not None:  # failed after its first byte: charged to this replica all the same
                code = broke
                if replica is not None:
                    self._outcome(replica, failed=True)
                resp.close()
            else:
                resp.release()
            return relayed
        finally:
            if replica is not None:
                replica.in_flight -= 1
            if code is None:  # the client left before the upstream answered: no outcome to count
                metrics.attempt_abandoned(revision)
            else:
                metrics.attempt_finished(revision, code, perf_counter() - started, req.adapter)

    def _outcome(self, replica: Replica, *, failed: bool) -> None:
        self.state.balancer.outliers.record(replica, failed, self.state.balancer.pool(replica.revision))

    async def _relay_events(
        self, req: ProxyRequest, resp: aiohttp.ClientResponse, head: Head, revision: str, downstream: web.Request,
        limit: float, capture: Capture | None, answer: Answer | None,
    ) -> web.StreamResponse | Seam:
        """An event-stream answer, through `Answer` (a new one, or the continued one)."""
        assert head.chunks is not None
        if answer is None:
            ids = resumable_answer(resp) if self._resumable(req) else None
            # Unstreamed, a resumable engine answers as events too: the client gets the final JSON alone.
            answer = Answer(downstream, self.metrics, streamed=req.streamed or ids is None, capture=capture,
                            meter=req.meter)
            if ids is not None:
                answer.resumable = True
                answer.progress.response_id, answer.progress.created = ids
        stall_after = limit
        if answer.resumable:  # a stall it can be continued from ends sooner: at interChunkTimeout
            stall_after = min(limit, self.state.config.migration.inter_chunk_timeout_seconds)
        headers = _relayed_headers(resp, revision)
        return await answer.relay(resp, head.first, head.chunks, revision, stall_after, headers)

    async def _relay(
        self, resp: aiohttp.ClientResponse, head: Head, revision: str, downstream: web.Request, limit: float,
        capture: Capture | None = None, rewrite: Callable[[bytes], bytes] | None = None, meter: Meter | None = None,
    ) -> tuple[web.StreamResponse, str | None]:
        """Pass on an answer that is not an event stream from its first bytes; with it the attempt's code
        when the upstream failed mid-answer (the client is cut off then: too late to change the status, and
        a truncated answer must not look complete)."""
        headers = _relayed_headers(resp, revision)
        if head.chunks is None:
            if capture is not None and head.first is not None:
                capture.add(head.first)
            headers.popall("Content-Length", None)  # set again from the body
            body = head.first
            if meter is not None and resp.status == 200:
                meter.answer = body
            if rewrite is not None and body is not None and resp.status == 200:
                body = rewrite(body)
            return web.Response(status=resp.status, reason=resp.reason, body=body, headers=headers), None
        out = web.StreamResponse(status=resp.status, reason=resp.reason, headers=headers)
        await out.prepare(downstream)
        chunk = head.first
        while chunk is not None:
            if capture is not None:
                capture.add(chunk)
            if not await write(out, chunk, resp):
                return out, None
            try:
                chunk = await next_chunk(head.chunks, limit)
            except (Stalled, *UPSTREAM_ERRORS) as exc:
                log.warning("upstream %s (%s) broke off mid-response: %r", revision, resp.url.origin(), exc)
                _drop(downstream)
                return out, TIMEOUT if isinstance(exc, Stalled) else "error"
        await write(out, None, resp)
        return out, None

    # ------------------------------------------------------------------------------- shadow

    def _maybe_shadow(self, req: ProxyRequest, primary: str) -> Comparison | None:
        """Mirror ``req`` to the canary (bounded); a reproducible one is compared with the primary's answer."""
        config = self.state.config
        canary = config.canary
        fraction = config.shadow_fraction
        if canary is None or canary == primary or fraction <= 0.0 or random.random() >= fraction:
            return None
        if len(self._shadow_tasks) >= self._shadow_limit:
            return None  # mirroring must never pile up behind a slow canary
        replica = self.state.balancer.pick(canary)
        if replica is None:
            return None
        comparison = None
        if comparable(req.body):
            comparison = Comparison(lambda result, diff: self.metrics.shadow_compared(canary, result, diff))
        task = asyncio.create_task(self._shadow(req, replica, comparison))
        self._shadow_tasks.add(task)
        task.add_done_callback(self._shadow_tasks.discard)
        return comparison

    async def _shadow(self, req: ProxyRequest, replica: Replica, comparison: Comparison | None = None) -> None:
        replica.in_flight += 1
        started = perf_counter()
        try:
            async with self._session.request(
                req.method, replica.url + req.path, data=req.body or None,
                headers=[*req.headers, ("X-Folio-Shadow", "1")], timeout=self._timeout,
            ) as resp:  # fmt: skip
                async for chunk in resp.content.iter_any():
                    if comparison is not None:
                        comparison.shadow.add(chunk)
                code = str(resp.status)
        except UPSTREAM_ERRORS:
            code = "error"
        finally:
            replica.in_flight -= 1
        self.metrics.shadowed(replica.revision, code, perf_counter() - started)
        if comparison is not None:
            comparison.finish_shadow(int(code) if code.isdigit() else None)

    async def close(self) -> None:
        await self.hold.close()
        for task in list(self._shadow_tasks):
            task.cancel()
        await asyncio.gather(*self._shadow_tasks, return_exceptions=True)


async def _head(resp: aiohttp.ClientResponse) -> Head:
    """The answer's first bytes: a complete, small answer (a non-streaming completion arrives all at
    once) whole, so that it goes out in one write rather than headers and body apart (a send is the
    router's costliest call); else its first chunk, whatever has arrived (never wait to fill a buffer)."""
    length = resp.content_length
    if length is not None and length <= WHOLE_BODY_MAX and resp.content_type != "text/event-stream":
        return Head(await resp.read())
    chunks = resp.content.iter_any()
    try:
        return Head(await anext(chunks), chunks)
    except StopAsyncIteration:
        return Head(None, chunks)


async def _failure(resp: aiohttp.ClientResponse, revision: str) -> Failure:
    try:
        body = await resp.read()  # error answers are small
    except UPSTREAM_ERRORS:
        body = b""
    finally:
        resp.release()
    headers = _relayed_headers(resp, revision)
    headers.popall("Content-Length", None)  # web.Response sets it from the body
    return Failure(str(resp.status), resp.status, headers, body, reason=f"HTTP {resp.status}")


def _drop(downstream: web.Request) -> None:
    if downstream.transport is not None:
        downstream.transport.close()


def _relayed_headers(resp: aiohttp.ClientResponse, revision: str) -> CIMultiDict[str]:
    """The upstream's response headers the client gets, and the revision that answered."""
    headers = CIMultiDict((k, v) for k, v in resp.headers.items() if k.lower() not in _DROP_RESPONSE_HEADERS)
    headers["X-Folio-Revision"] = revision
    return headers
