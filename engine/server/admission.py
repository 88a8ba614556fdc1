"""Admission in front of the API routes: refuse new work while draining, inject faults when asked to,
and count requests in flight so a drain knows when it is done.

A plain ASGI middleware, so a streaming response counts as in flight until its last byte is sent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Receive, Scope, Send

from folio.engine.outputs import RequestOutput
from folio.engine.server.async_engine import AsyncEngine, RequestAborted
from folio.engine.server.errors import OpenAIError, unavailable
from folio.engine.server.openai_errors import ErrorCode

log = logging.getLogger("folio.server")


@dataclass(frozen=True)
class Faults:
    """Test aids (off by default): make a revision misbehave so that a rollback can be exercised."""

    error_rate: float = 0.0  # fraction of API requests answered with a 500
    latency_ms: float = 0.0  # added before each API request is handled
    # the process kills itself (SIGKILL, as the OOM killer does) once it has generated this many tokens; 0: never
    crash_after_tokens: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.error_rate <= 1.0:
            raise ValueError(f"fault error rate must be in [0, 1], got {self.error_rate}")
        if self.latency_ms < 0:
            raise ValueError(f"fault latency must be >= 0 ms, got {self.latency_ms}")
        if self.crash_after_tokens < 0:
            raise ValueError(f"fault crash-after-tokens must be >= 0, got {self.crash_after_tokens}")


def crash_after(tokens: int) -> Callable[[list[RequestOutput]], None]:
    """``--fault-crash-after-tokens``: an observer of the engine's step outputs that kills this process with
    SIGKILL (nothing runs after it, as after an OOM kill) at the step that brings the tokens it has generated,
    all requests together, to ``tokens``: before that step's outputs reach any client, in the middle of
    whatever it was answering."""
    assert tokens > 0
    generated = 0

    def observe(outputs: list[RequestOutput]) -> None:
        nonlocal generated
        generated += sum(len(out.outputs[0].token_ids) for out in outputs if out.outputs)
        if generated >= tokens:
            log.critical("injected fault: crashing after %d generated tokens (--fault-crash-after-tokens)", generated)
            os.kill(os.getpid(), signal.SIGKILL)

    return observe


@dataclass
class ServerState:
    engine: AsyncEngine
    faults: Faults = field(default_factory=Faults)
    draining: bool = False
    in_flight: int = 0
    _idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self._idle.set()
        self._rng = random.Random(self.faults.seed)

    @property
    def ready(self) -> bool:
        return self.engine.alive and not self.draining

    async def drain(self, timeout: float) -> bool:
        """Stops admitting requests and waits for those in flight. Past ``timeout`` seconds the rest
        are aborted and answered with a 503 (or a final error event). True when nothing was cut short."""
        self.draining = True
        log.info("draining: %d request(s) in flight, waiting up to %.1fs", self.in_flight, timeout)
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            log.warning("drain timed out; aborting %d request(s)", self.in_flight)
            self.engine.abort_all(RequestAborted("The server is shutting down; retry the request."))
            try:  # let the aborted requests send their answers
                await asyncio.wait_for(self._idle.wait(), 5.0)
            except asyncio.TimeoutError:
                log.error("%d request(s) still open after the abort", self.in_flight)
            return False

    def request_started(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def request_finished(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    def fault(self) -> bool:
        return self.faults.error_rate > 0 and self._rng.random() < self.faults.error_rate


_ADMITTED = ("/v1/", "/folio/v1/")


class AdmissionMiddleware:
    """Wraps the API routes (POST /v1/...); probes and metrics pass straight through."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith(_ADMITTED):
            await self.app(scope, receive, send)
            return
        # Folio's own endpoints (the parity gate's) drain like the API but take no injected fault
        injects = scope["path"].startswith("/v1/")
        state = self.state
        if state.draining:
            err = unavailable("The server is shutting down; retry on another replica.", code=ErrorCode.SHUTTING_DOWN)
            await err.response()(scope, receive, send)
            return
        state.request_started()
        try:
            if injects and state.faults.latency_ms:
                await asyncio.sleep(state.faults.latency_ms / 1000)
            if injects and state.fault():
                err = OpenAIError(500, "Injected fault (--fault-error-rate).", code=ErrorCode.FAULT_INJECTED)
                await err.response()(scope, receive, send)
                return
            await self.app(scope, receive, send)
        finally:
            state.request_finished()
