"""Fake engine replicas on loopback for the router tests: aiohttp apps in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
from aiohttp import web
from multidict import CIMultiDict

from folio.engine.server.openai_errors import error_body
from folio.operator.router.server import bind
from tests.support.wait import until


@dataclass
class Seen:
    path: str
    headers: CIMultiDict[str]
    body: bytes


@dataclass
class FakeUpstream:
    """Answers like an engine; each knob changes how it behaves from the next request on."""

    name: str
    status: int = 200  # non-200: answer every completion with this status, OpenAI error shape
    health_status: int = 200
    gate: asyncio.Event | None = None  # streaming: hold the rest of the stream until set
    hold: asyncio.Event | None = None  # hold every completion (before headers) until set
    hold_body: asyncio.Event | None = None  # streaming: send the headers, hold the first chunk until set
    break_stream: bool = False  # streaming: drop the connection after the first chunk
    metrics: str = ""  # the /metrics page (Prometheus text), as an engine would expose its load
    metrics_status: int = 200
    seen: list[Seen] = field(default_factory=list)
    text: str = "hi"  # each choice's text (shadow comparison tells answers apart by it)
    cancelled: int = 0  # answers cut short because the client (the router) went away
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics, status=self.metrics_status, content_type="text/plain")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(Seen(request.path_qs, CIMultiDict(request.headers), body))
        try:
            if self.hold is not None:
                await self.hold.wait()
            if self.status != 200:
                # answered as the engine words its errors
                return web.json_response(error_body(self.status, f"{self.name} failed"), status=self.status)
            if not json.loads(body).get("stream"):
                return web.json_response({"served_by": self.name, "choices": [{"text": self.text}]})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            if self.hold_body is not None:
                await resp.write(b"")  # puts the buffered headers on the wire, and no body byte
                await self.hold_body.wait()
            await resp.write(f'data: {{"served_by": "{self.name}", "n": 1}}\n\n'.encode())
            if self.break_stream:
                assert request.transport is not None
                request.transport.close()
                return resp
            if self.gate is not None:
                await self.gate.wait()
            choice = json.dumps({"served_by": self.name, "n": 2, "choices": [{"index": 0, "text": self.text}]})
            await resp.write(f"data: {choice}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1  # aiohttp notices a vanished client when it next writes
            raise

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": self.name}]}
        )

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"status": "ok" if self.health_status == 200 else "bad"}, status=self.health_status
        )


@contextlib.asynccontextmanager
async def serving(*upstreams: FakeUpstream) -> AsyncIterator[None]:
    """Run each fake on its own loopback port (a free one, filling in `.url`) for the block's duration."""
    runners: list[web.AppRunner] = []
    try:
        for up in upstreams:
            # like uvicorn under the engine, a client (the router) that leaves cancels its request
            runner = web.AppRunner(up.app(), handle_signals=False, access_log=None, handler_cancellation=True)
            await runner.setup()
            runners.append(runner)
            port = int(up.url.rsplit(":", 1)[1]) if up.url else 0  # a restarted fake keeps its address
            sock = bind("127.0.0.1", port)
            await web.SockSite(runner, sock, shutdown_timeout=0.1).start()
            up.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        yield
    finally:
        for up in upstreams:  # release anything still parked so shutdown does not wait on it
            for event in (up.gate, up.hold, up.hold_body):
                if event is not None:
                    event.set()
        for runner in runners:
            await runner.cleanup()


def free_port() -> int:
    """A loopback port free right now (for servers started in a subprocess)."""
    with bind("127.0.0.1", 0) as sock:
        return sock.getsockname()[1]


async def until_ready(client: httpx.AsyncClient, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    """Wait for a `folio router` started as ``proc`` to answer /ready with 200 (on ``client``'s base URL)."""

    async def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"folio router exited: {proc.communicate()[0]}")
        return (await client.get("/ready")).status_code == 200

    await until(ready, timeout, "the router ready", interval=0.05, ignore=(httpx.TransportError,))


def dead_url() -> str:
    """A loopback URL nothing listens on: connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"
