"""Running a router: from the CLI, or inside an existing event loop (tests, `folio up`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import AsyncIterator

from aiohttp import web

from folio.engine.server.read_timeouts import ReadTimeouts, guarded_factory
from folio.operator.router.app import RouterApp


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; port 0 picks a free one (read it back from `getsockname()`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto given explicitly: asyncio only sets TCP_NODELAY on accepted sockets whose proto says TCP,
    # and without it Nagle plus delayed ACKs add ~40 ms to every keep-alive request.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class GuardedSockSite(web.SockSite):
    """aiohttp's SockSite, with header and body read timeouts on every connection."""

    __slots__ = ("_timeouts",)

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, timeouts: ReadTimeouts, **kwargs: float) -> None:
        super().__init__(runner, sock, **kwargs)
        self._timeouts = timeouts

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner (SockSite.start without the server)
        assert self._runner.server is not None
        self._server = await asyncio.get_running_loop().create_server(
            guarded_factory(self._runner.server, self._timeouts), sock=self._sock, backlog=self._backlog
        )


@contextlib.asynccontextmanager
async def running_router(
    app: RouterApp,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    sock: socket.socket | None = None,
    drain_s: float = 1.0,
    read_timeouts: ReadTimeouts | None = None,
) -> AsyncIterator[str]:
    """Serve `app` in this event loop; yields its base URL. On exit, in-flight requests get
    `drain_s` seconds to finish before the router stops. A client slower than `read_timeouts` to
    send a request's headers or body is disconnected."""
    runner = web.AppRunner(
        app.web_app(),
        access_log=None,  # a line per request costs more than proxying it
        handle_signals=False,  # the embedding process owns its signals
        handler_cancellation=True,  # a client that leaves cancels its upstream request
    )
    sock = sock or bind(host, port)
    await runner.setup()
    try:
        await GuardedSockSite(runner, sock, read_timeouts or ReadTimeouts(), shutdown_timeout=drain_s).start()
        yield base_url(sock)
    finally:
        await runner.cleanup()
        sock.close()


async def serve_until_signalled(
    app: RouterApp, sock: socket.socket, *, drain_s: float = 30.0, read_timeouts: ReadTimeouts | None = None
) -> None:
    """The CLI's loop: serve until SIGTERM/SIGINT, then drain in-flight requests (a second signal
    stops at once)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if stop.is_set():
            raise SystemExit(1)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    async with running_router(app, sock=sock, drain_s=drain_s, read_timeouts=read_timeouts):
        await stop.wait()
