"""Answers that survive their replica: an event stream relayed across attempts, continued where one broke off.

A completion or chat request goes upstream with ``X-Folio-Resumable: 1`` while
``spec.router.migration.maxAttempts`` is above 0; an engine that honours it writes records with its answer
(`folio.engine.server.continuation`, the fixed contract; `progress` reads them). Every answer that is an
event stream is relayed by an `Answer`: whole events, records stripped. When its replica fails after the
first byte — the connection breaks, the answer ends before its end (``[DONE]``, or an unstreamed answer's
final ``data:`` event), it is silent past min(``interChunkTimeout``, its attempt timeout), or the engine
says it cannot finish (a ``failed`` record) — the attempt ends in a `Seam` and `carry_on` continues it:
the client's body again, plus ``folio_resume`` (every choice the client has anything of, with all its
token ids), to another ready replica of the failed one's revision that this request has not tried, else
to stable. The continuation writes into the same client response; an unstreamed answer reaches its client
only whole, as ``application/json``, so there the seam is invisible.

At most ``maxAttempts`` continuations per request (one that fails before its first byte counts too). When
none can be made the client gets a clean end: a stream an OpenAI-shaped error event and ``[DONE]``, an
unstreamed answer a 502 (504 after a stall). With migration off no record is asked for, and a broken event
stream still ends that cleanly instead of being cut.

The failed attempt stays charged to its revision (the proxy counts it ``error`` or ``timeout`` and reports
a failure to outlier detection), and each seam is counted:
``folio_router_migrations_total{revision (the failed one), reason, outcome}``, with the gap the client
saw in ``folio_router_migration_gap_seconds``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from folio.engine.server.continuation import (
    CREATED_HEADER,
    RESPONSE_ID_HEADER,
    RESUMABLE_HEADER,
    RESUME_FIELD,
)
from folio.engine.server.openai_errors import ErrorCode
from folio.operator import metric_names as m
from folio.operator.router.balancer import Replica
from folio.operator.router.errors import error_body, error_response
from folio.operator.router.metrics import RouterMetrics
from folio.operator.router.progress import DONE_EVENT, Progress
from folio.operator.router.shadow_compare import Capture
from folio.operator.router.state import RoutingState
from folio.operator.router.tenants import Meter
from folio.operator.router.timeouts import GATEWAY_TIMEOUT, Stalled, next_chunk

log = logging.getLogger(__name__)

RESUMABLE = (RESUMABLE_HEADER, "1")
BAD_GATEWAY = 502
UPSTREAM_ERRORS = (aiohttp.ClientError, TimeoutError, OSError)  # an upstream that failed, or went silent


def resumable_answer(resp: aiohttp.ClientResponse) -> tuple[str, int] | None:
    """The answer's id and created when its engine honours the contract, else None."""
    headers = resp.headers
    if headers.get(RESUMABLE_HEADER) != "1":
        return None
    response_id, created = headers.get(RESPONSE_ID_HEADER), headers.get(CREATED_HEADER)
    if not response_id or created is None:
        return None
    try:
        return response_id, int(created)
    except ValueError:
        return None


@dataclass
class Seam:
    """An answer whose attempt broke off after its first byte: where, why, and the answer to carry on."""

    answer: Answer
    revision: str
    reason: str  # m.MIGRATION_RESET | m.MIGRATION_TIMEOUT | m.MIGRATION_ENGINE_ERROR
    detail: str

    @property
    def code(self) -> str:
        """The broken attempt's code, as the proxy counts attempts: ``timeout`` after a stall, else ``error``."""
        return m.TIMEOUT if self.reason == m.MIGRATION_TIMEOUT else "error"


async def write(out: web.StreamResponse, chunk: bytes | None, resp: aiohttp.ClientResponse) -> bool:
    """Pass a chunk on (None: end the response); False when the client has gone."""
    try:
        await (out.write_eof() if chunk is None else out.write(chunk))
    except ConnectionError:
        resp.close()  # drop the upstream too, so the engine aborts the request
        return False
    return True


class Answer:
    """One request's answer as its client gets it, across the attempts that write it.

    ``streamed``: relayed event by event into one client response (prepared at the first attempt's first
    byte); else the whole JSON answer is sent at once at the end. ``resumable``: the engine writes records,
    so a broken attempt can be continued."""

    def __init__(
        self, downstream: web.Request, metrics: RouterMetrics, *, streamed: bool, capture: Capture | None = None,
        meter: Meter | None = None,
    ) -> None:
        self.downstream = downstream
        self.progress = Progress(streamed)
        self.resumable = False
        self.continuations = 0
        self.capture = capture
        self.meter = meter
        self.out: web.StreamResponse | None = None
        self._metrics = metrics
        self._last = 0.0  # when the client got its last byte (unstreamed: when the last one arrived)
        self._gap: tuple[str, float] | None = None  # a seam the client has not seen the end of: revision, since

    @property
    def streamed(self) -> bool:
        return self.progress.streamed

    async def relay(
        self, resp: aiohttp.ClientResponse, first: bytes | None, chunks: AsyncIterator[bytes], revision: str,
        stall_after: float, headers: CIMultiDict[str],
    ) -> web.StreamResponse | Seam:
        """Relay one attempt's answer from its first chunk: the client's response when it is complete (or
        the client left), a `Seam` when the attempt broke off."""
        progress = self.progress
        progress.restart()
        streamed = progress.streamed
        if streamed and self.out is None:
            self.out = web.StreamResponse(status=resp.status, reason=resp.reason, headers=headers)
            await self.out.prepare(self.downstream)
            self._last = perf_counter()
        elif not streamed:
            self._seen()
        chunk = first
        try:
            while chunk is not None:
                block = progress.feed(chunk)
                if block:
                    if not await self._write(block, resp):
                        return self.out  # type: ignore[return-value]  # the client left (streamed only)
                elif not streamed:
                    self._seen()
                if progress.failed is not None or progress.ended:
                    break
                chunk = await next_chunk(chunks, stall_after)
        except Stalled as stall:
            return self._broke(revision, m.MIGRATION_TIMEOUT, str(stall), stall_after)
        except UPSTREAM_ERRORS as exc:
            return self._broke(revision, m.MIGRATION_RESET, f"{type(exc).__name__}: {exc}".rstrip(": "))
        if progress.failed is not None:
            failed = progress.failed
            return self._broke(revision, m.MIGRATION_ENGINE_ERROR, f"{failed.failed}: {failed.message}")
        if not progress.ended:
            return self._broke(revision, m.MIGRATION_RESET, "the answer ended before its end")
        if self.meter is not None:
            if streamed and self.resumable:  # (a stream of an engine without records: its reservation stands)
                self.meter.count(sum(len(c.token_ids) for c in progress.choices.values()))
            elif not streamed:
                self.meter.answer = progress.final
        if streamed:
            assert self.out is not None
            await write(self.out, None, resp)
            return self.out
        return self._whole(resp, headers)

    def _whole(self, resp: aiohttp.ClientResponse, headers: CIMultiDict[str]) -> web.Response:
        """An unstreamed answer, complete: its JSON in one piece, as the engine would answer it unasked."""
        final = self.progress.final or b""
        if self.capture is not None:
            self.capture.add(final)
        headers = CIMultiDict(headers)
        headers.popall("Content-Length", None)
        headers["Content-Type"] = "application/json"
        return web.Response(status=resp.status, reason=resp.reason, body=final, headers=headers)

    def _seen(self) -> None:
        """A byte went to the client (unstreamed: arrived for it, since its client sees none until the end):
        the end of a seam's gap, if one is open."""
        now = perf_counter()
        if self._gap is not None:
            revision, since = self._gap
            self._gap = None
            self._metrics.seam_gap(revision, now - since)
        self._last = now

    async def _write(self, block: bytes, resp: aiohttp.ClientResponse) -> bool:
        assert self.out is not None
        if self.capture is not None:
            self.capture.add(block)
        if not await write(self.out, block, resp):
            return False
        self._seen()
        return True

    def _broke(self, revision: str, reason: str, detail: str, stalled: float | None = None) -> Seam:
        log.warning("upstream %s broke off mid-answer (%s): %s", revision, reason, detail)
        if self._gap is None:
            self._gap = (revision, self._last)
        if stalled is not None:
            detail = f"sent nothing for {stalled:g}s"
        return Seam(self, revision, reason, detail)

    def continuation(self, parsed: dict[str, Any]) -> bytes:
        """The body that continues this answer: the client's, with what it has so far as ``folio_resume``."""
        return json.dumps({**parsed, RESUME_FIELD: self.progress.resume()}).encode()

    async def fail(self, seam: Seam) -> web.StreamResponse:
        """The clean end of an answer that cannot go on: an error event and ``[DONE]`` on a stream, else a 502
        (504 after a stall), in OpenAI's shape."""
        self._gap = None  # the client saw no continuation
        timed_out = seam.reason == m.MIGRATION_TIMEOUT
        status = GATEWAY_TIMEOUT if timed_out else BAD_GATEWAY
        code = ErrorCode.UPSTREAM_TIMEOUT if timed_out else ErrorCode.UPSTREAM_UNREACHABLE
        failed = self.progress.failed
        if seam.reason == m.MIGRATION_ENGINE_ERROR and failed is not None:
            code = _error_code(failed.failed, code)
        message = f"upstream {seam.revision} broke off mid-answer ({seam.detail}); the answer is incomplete"
        if not self.streamed or self.out is None:
            return error_response(status, message, code=code)
        out = self.out
        try:
            await out.write(b"data: " + error_body(status, message, code) + b"\n\n" + DONE_EVENT)
            await out.write_eof()
        except ConnectionError:
            pass  # the client has gone too
        return out


# One continuation attempt on a replica with a body: its response, a `Seam`, or a failure before its first byte.
Send = Callable[[Replica, bytes], Awaitable[object]]


async def carry_on(
    seam: Seam, state: RoutingState, metrics: RouterMetrics, parsed: dict[str, Any] | None,
    tried: list[Replica], send: Send, affinity: str | None = None,
) -> web.StreamResponse:
    """Continue ``seam``'s answer on other replicas until it is complete or cannot go on; ``send`` makes one
    attempt (anything but a response or a `Seam` is a failure before its first byte)."""
    max_attempts = state.config.migration.max_attempts
    while True:
        answer = seam.answer
        if max_attempts == 0 or parsed is None:  # migration off (or not a request it applies to)
            return await answer.fail(seam)
        outcome, result = m.MIGRATION_FAILED, None
        if answer.resumable and not answer.progress.lost:
            outcome, result = await _across(seam, state, parsed, tried, send, max_attempts, affinity)
        metrics.migrated(seam.revision, seam.reason, outcome)
        if result is None:
            log.warning("answer of %s not continued (%s)", seam.revision, outcome)
            return await answer.fail(seam)
        if not isinstance(result, Seam):
            return result
        seam = result


async def _across(
    seam: Seam, state: RoutingState, parsed: dict[str, Any], tried: list[Replica], send: Send,
    max_attempts: int, affinity: str | None,
) -> tuple[str, web.StreamResponse | Seam | None]:
    """One seam's continuation: the outcome, and what the attempt that took it came to."""
    answer = seam.answer
    while answer.continuations < max_attempts:
        target = next_replica(state, seam.revision, tried, affinity)
        if target is None:
            return m.MIGRATION_NO_REPLICA, None
        answer.continuations += 1
        tried.append(target)
        result = await send(target, answer.continuation(parsed))
        if isinstance(result, web.StreamResponse | Seam):
            return m.MIGRATION_CONTINUED, result
    return m.MIGRATION_FAILED, None


def next_replica(state: RoutingState, revision: str, tried: list[Replica], affinity: str | None) -> Replica | None:
    """Another ready replica of ``revision`` this request has not tried, else one of stable's."""
    balancer, stable = state.balancer, state.config.stable
    replica = balancer.pick(revision, exclude=tried, key=affinity)
    if replica is None and stable is not None and stable != revision:
        replica = balancer.pick(stable, exclude=tried, key=affinity)
    return replica


def _error_code(word: str | None, default: ErrorCode) -> ErrorCode:
    try:
        return ErrorCode(word)
    except ValueError:
        return default
