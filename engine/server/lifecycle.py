"""The uvicorn server of `folio serve`, with a graceful drain on SIGTERM/SIGINT.

Uvicorn's own handling closes the listening socket at once (new clients get connection refused) and
then re-raises the signal, so the process dies by SIGTERM. Kubernetes wants better: /ready turns 503
immediately, new requests get a 503 the router can retry elsewhere, those in flight finish within
--shutdown-timeout, and the process exits 0. A second signal stops without waiting for them: what is
in flight is aborted and still answered in the OpenAI shape (a 503 ``shutting_down``, or a final error
event and ``[DONE]`` on a stream), never a plain-text 500 or a cut stream.

An engine whose step loop has died cannot serve again: the server then answers what was in flight,
stops and exits non-zero, so that its supervisor (`folio up`, or the kubelet) starts a fresh one.

With `--metrics-port`, a second, small server (`MetricsServer`: /metrics only) runs in the same event loop:
it starts before the API server listens and stops after the API server's drain, so a scraper sees the
drain's figures to the end. Signals are the API server's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator
from types import FrameType

import uvicorn

from folio.engine.server.admission import ServerState
from folio.engine.server.async_engine import RequestAborted

log = logging.getLogger("folio.server")


class MetricsServer(uvicorn.Server):
    """A uvicorn server run inside another's event loop and lifetime: `start` binds and serves, `stop`
    closes; it leaves signal handling to the server that owns the loop."""

    _ticker: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the API server's handlers drain both

    async def start(self) -> None:
        """Binds and serves; raises SystemExit (as uvicorn does) when the port cannot be bound."""
        if not self.config.loaded:
            self.config.load()
        self.lifespan = self.config.lifespan_class(self.config)
        await self.startup()
        self._ticker = asyncio.ensure_future(self.main_loop())

    async def stop(self) -> None:
        self.should_exit = True
        if self._ticker is not None:
            await self._ticker
        if self.started:
            await self.shutdown()


class DrainingServer(uvicorn.Server):
    def __init__(
        self,
        config: uvicorn.Config,
        state: ServerState,
        shutdown_timeout: float,
        metrics: MetricsServer | None = None,
    ) -> None:
        super().__init__(config)
        self.metrics = metrics  # serves /metrics on a port of its own, for as long as this server runs
        self.state = state
        self.shutdown_timeout = shutdown_timeout
        self.clean_drain: bool | None = None  # set once a drain ran: False if requests were cut short
        self.engine_died = False  # set when the engine loop died: the process should exit non-zero
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signalled = False
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.metrics is None:
            await super().startup(sockets)
            return
        await self.metrics.start()
        try:
            await super().startup(sockets)
        except BaseException:  # e.g. the API port was taken (SystemExit): close the metrics port too
            await self.metrics.stop()
            raise

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().shutdown(sockets)
        finally:
            if self.metrics is not None:
                await self.metrics.stop()

    async def on_tick(self, counter: int) -> bool:
        error = self.state.engine.error
        if error is not None and not self.engine_died:
            self.engine_died = True
            log.critical("the engine loop died (%r); stopping so that this replica is restarted", error)
            self.state.draining = True
            self.should_exit = True
        return await super().on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Deliberately not recording the signal: uvicorn would re-raise it after shutdown.
        if self._signalled and self._loop is not None:
            log.warning("signal %d again: aborting %d request(s) in flight and stopping", sig, self.state.in_flight)
            self._loop.call_soon_threadsafe(self._abort_now)
            return
        if self._loop is None or not self.started:
            self.should_exit = True
            self.force_exit = self._signalled
            return
        self._signalled = True
        log.info(
            "signal %d: draining (up to %.1fs); a second signal stops at once", sig, self.shutdown_timeout
        )
        self.state.draining = True  # /ready answers 503 from this instant
        # A signal handler may interrupt the loop anywhere: hand over the way asyncio's own handlers do.
        self._loop.call_soon_threadsafe(self._start_drain)

    def _abort_now(self) -> None:
        # Not force_exit: uvicorn then waits (timeout_graceful_shutdown) for the aborted answers to go out.
        if self._drain_task is not None:
            self._drain_task.cancel()  # its wait would end now too, and call this drain clean
        self.state.engine.abort_all(RequestAborted("The server is stopping; retry the request."))
        self.clean_drain = False
        self.should_exit = True

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        self.clean_drain = await self.state.drain(self.shutdown_timeout)
        self.should_exit = True
