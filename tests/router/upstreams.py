"""Fake engine replicas on loopback for the router tests: aiohttp apps in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiohttp import web
from multidict import CIMultiDict

from folio.engine.server.continuation import (
    CREATED_HEADER,
    RESPONSE_ID_HEADER,
    RESUMABLE_HEADER,
    RESUME_FIELD,
    Record,
)
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
    usage: dict[str, int] | None = None  # the `usage` of a whole answer
    cancelled: int = 0  # answers cut short because the client (the router) went away
    url: str = ""
    # Speaking the resume contract (`folio.engine.server.continuation`) when a request asks for it: each
    # choice's answer is a deterministic token sequence (`token`), so a continued answer can be checked
    # against the uninterrupted one (`expected_stream`, `expected_json`). The faults count the events this
    # answer writes (0: before the first) and apply to every answer of this fake, continuations included.
    resumable: bool = False
    lengths: tuple[int, ...] = (4,)  # tokens of choice i (the last entry for the rest)
    die_after: int | None = None  # write this many events, then half of one, then drop the connection
    stall_after: int | None = None  # write this many events, then nothing
    fail_after: int | None = None  # write this many events, then a `failed` record, an error event, [DONE]
    resumes: list[dict[str, Any]] = field(default_factory=list)  # the folio_resume objects received
    failing_models: frozenset[str] = frozenset()  # requests naming one of these models get a 500
    adapters: tuple[str, ...] = ()  # the adapters /v1/models lists (as an engine names them: NAME@REVISION)

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
            parsed = json.loads(body)
            status = 500 if parsed.get("model") in self.failing_models else self.status
            if status != 200:
                # answered as the engine words its errors
                return web.json_response(error_body(status, f"{self.name} failed"), status=status)
            if self.resumable and request.headers.get(RESUMABLE_HEADER) == "1":
                return await self._resumable(request, parsed)
            if not parsed.get("stream"):
                usage = {"usage": self.usage} if self.usage is not None else {}
                return web.json_response({"served_by": self.name, "model": parsed.get("model"),
                                          "choices": [{"text": self.text}], **usage})
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

    async def _resumable(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        resume = body.get(RESUME_FIELD)
        if resume is not None:
            self.resumes.append(resume)
        rid, created = (resume["id"], resume["created"]) if resume else ("cmpl-0", CREATED)
        resp = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", RESUMABLE_HEADER: "1", RESPONSE_ID_HEADER: rid,
            CREATED_HEADER: str(created),
        })  # fmt: skip
        await resp.prepare(request)
        events = answer_events(body, request.path, self.lengths)
        for written, (record, data) in enumerate(events):
            if written == self.die_after:
                await resp.write(record.line().encode() + b'data: {"choices": [{"ind')  # half an event
                assert request.transport is not None
                request.transport.close()
                return resp
            if written == self.fail_after:
                failed = Record(failed="shutting_down", message="the engine is stopping").line().encode()
                error = json.dumps(error_body(503, "shutting down", code="shutting_down")).encode()
                await resp.write(failed + b"data: " + error + b"\n\n" + b"data: [DONE]\n\n")
                return resp
            if written == self.stall_after:
                await asyncio.Event().wait()  # until the router gives up on this answer and leaves
            await resp.write(record.line().encode() + (b"data: " + data + b"\n" if data else b"") + b"\n")
        if not body.get("stream"):
            await resp.write(b"data: " + json.dumps(whole_answer(body, request.path, self.lengths)).encode() + b"\n\n")
        else:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _models(self, request: web.Request) -> web.Response:
        adapters = [{"id": a, "object": "model", "owned_by": self.name, "parent": "m"} for a in self.adapters]
        return web.json_response(
            {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": self.name}, *adapters]}
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


# ------------------------------------------------------------------- the resume contract's fake answers

CREATED = 1_700_000_000


def token(index: int, position: int) -> int:
    """Choice ``index``'s token at ``position``: every fake answers every request with the same tokens."""
    return 1000 * (index + 1) + position


def _length(lengths: tuple[int, ...], index: int) -> int:
    return lengths[min(index, len(lengths) - 1)]


def _logprob(tok: int) -> float:
    return -tok / 10_000


def answer_events(body: dict[str, Any], path: str, lengths: tuple[int, ...]) -> list[tuple[Record, bytes]]:
    """The (record, data line) events of an answer to ``body``, from where its ``folio_resume`` left it:
    a listed choice goes on after its tokens (a finished one is done), an unlisted one starts over. Chat
    opens each choice (an event with no token); an unstreamed answer's events are records alone."""
    chat, streamed, n = path.startswith("/v1/chat"), bool(body.get("stream")), int(body.get("n", 1))
    resume = body.get(RESUME_FIELD)
    listed = {c["index"]: c for c in resume["choices"]} if resume else {}
    rid = resume["id"] if resume else "cmpl-0"
    start = {}
    for i in range(n):
        choice = listed.get(i)
        ids = choice["token_ids"] if choice else []
        assert ids == [token(i, k) for k in range(len(ids))], f"choice {i} resumed with {ids}"
        start[i] = _length(lengths, i) if choice and choice.get("finish_reason") else len(ids)
    events: list[tuple[Record, bytes]] = []

    def data(i: int, piece: dict[str, Any], finish: str | None) -> bytes:
        if not streamed:
            return b""
        choice = {"index": i, "delta": piece} if chat else {"index": i, "text": piece["content"]}
        kind = "chat.completion.chunk" if chat else "text_completion"
        return json.dumps({"id": rid, "object": kind, "created": CREATED,
                           "choices": [{**choice, "finish_reason": finish}]}).encode()

    if chat:
        events += [(Record(index=i, token_ids=()), data(i, {"role": "assistant", "content": ""}, None))
                   for i in range(n) if i not in listed]
    for k in range(max(_length(lengths, i) for i in range(n))):
        for i in range(n):
            if not start[i] <= k < _length(lengths, i):
                continue
            tok = token(i, k)
            finish = "length" if k == _length(lengths, i) - 1 else None
            logprobs = [[[tok, _logprob(tok)]]] if not streamed and body.get("logprobs") else None
            record = Record(index=i, token_ids=(tok,), finish_reason=finish, logprobs=logprobs)
            events.append((record, data(i, {"content": f" t{tok}"}, finish)))
    return events


def whole_answer(body: dict[str, Any], path: str, lengths: tuple[int, ...]) -> dict[str, Any]:
    """An unstreamed answer, whole (the same however many seams it had); its logprobs are those the
    ``folio_resume`` carried, then this answer's own, so a continuation that lost them shows."""
    chat, n = path.startswith("/v1/chat"), int(body.get("n", 1))
    resume = body.get(RESUME_FIELD) or {"id": "cmpl-0", "choices": []}
    listed = {c["index"]: c for c in resume["choices"]}
    choices = []
    for i in range(n):
        tokens = [token(i, k) for k in range(_length(lengths, i))]
        text = "".join(f" t{tok}" for tok in tokens)
        choice: dict[str, Any] = {"index": i, "finish_reason": "length"}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        if body.get("logprobs"):
            carried = [entry[0][1] for entry in listed.get(i, {}).get("logprobs") or []]
            done = len(listed[i]["token_ids"]) if i in listed else 0
            choice["logprobs"] = {"token_logprobs": carried + [_logprob(tok) for tok in tokens[done:]]}
        choices.append(choice)
    return {"id": resume["id"], "object": "chat.completion" if chat else "text_completion", "created": CREATED,
            "choices": choices}


def expected_stream(body: dict[str, Any], path: str, lengths: tuple[int, ...] = (4,)) -> bytes:
    """What a client of an uninterrupted streamed answer gets: its data events and [DONE], no record."""
    events = answer_events({k: v for k, v in body.items() if k != RESUME_FIELD}, path, lengths)
    return b"".join(b"data: " + data + b"\n\n" for _, data in events) + b"data: [DONE]\n\n"
