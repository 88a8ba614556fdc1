"""The uvicorn server of `folio serve`, with a graceful drain on SIGTERM/SIGINT.

Uvicorn's own handling closes the listening socket at once (new clients get connection refused) and
then re-raises the signal, so the process dies by SIGTERM. Kubernetes wants better: /ready turns 503
immediately, new requests get a 503 the router can retry elsewhere, those in flight finish within
--shutdown-timeout, and the process exits 0. A second signal stops without waiting for them: what is
in flight is aborted and still answered in the OpenAI shape (a 503 ``shutting_down``, or a final error
event and ``[DONE]`` on a stream), never a plain-text 500 or a cut stream.

An engine whose step loop has died cannot serve again: the server then answers what was in flight,
stops and exits non-zero, so that its supervisor (`folio up`, or the kubelet) starts a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from types import FrameType

import uvicorn

from folio.engine.server.admission import ServerState
from folio.engine.server.async_engine import RequestAborted

log = logging.getLogger("folio.server")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState, shutdown_timeout: float) -> None:
        super().__init__(config)
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
