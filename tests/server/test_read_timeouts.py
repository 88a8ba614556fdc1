"""Header and body read timeouts: slow-loris clients are disconnected, normal clients never notice.

The framing tracker is checked byte by byte; the guard through a real `folio serve` (uvicorn) with
400 slow clients at once while ordinary requests keep succeeding. The router's twin is in
tests/router/test_read_timeouts.py.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from folio.engine.server.read_timeouts import ReadTimeouts, RequestFraming
from tests.server.conftest import start_serve, stop_serve
from tests.support.slowloris import slow_body, trickle

HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"
CHUNKED = (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"3;ext=1\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\nX-Trailer: 1\r\n\r\n")
GET = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def phases(stream: bytes, step: int) -> list[str]:
    """The tracker's phase after each ``step``-byte piece of ``stream``."""
    framing, out = RequestFraming(), []
    for i in range(0, len(stream), step):
        framing.feed(stream[i:i + step])
        out.append("head" if framing.in_head else "body" if framing.in_body else "idle")
    return out


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize("stream", [HEAD + b"hello", CHUNKED, GET, GET + HEAD + b"hello" + CHUNKED + GET],
                         ids=["length", "chunked", "no-body", "pipelined"])
def test_framing_ends_idle_after_whole_requests_whatever_the_pieces(stream: bytes, step: int) -> None:
    seen = phases(stream, step)
    assert seen[-1] == "idle"
    if step == 1:
        assert "head" in seen
        assert ("body" in seen) == (b"Content-Length" in stream or b"chunked" in stream)


def test_framing_phases_of_one_request() -> None:
    framing = RequestFraming()
    framing.feed(HEAD[:-1])
    assert framing.in_head
    framing.feed(HEAD[-1:] + b"hel")
    assert framing.in_body
    framing.feed(b"lo\r\n")  # a blank line between requests is allowed
    assert not framing.in_head and not framing.in_body
    framing.feed(b"G")
    assert framing.in_head


def test_a_malformed_head_stops_tracking() -> None:
    framing = RequestFraming()
    framing.feed(b"POST / HTTP/1.1\r\nContent-Length: lots\r\n\r\n")
    assert not framing.in_head and not framing.in_body  # the server's parser answers it


def test_timeouts_must_be_positive() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        ReadTimeouts(header_s=0)


async def normal_requests_meanwhile(url: str, stop: asyncio.Event, path: str = "/health",
                                    json: dict | None = None) -> list[int]:
    """Ordinary clients while the slow ones run: each request on a fresh connection."""
    codes: list[int] = []
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        while not stop.is_set():
            r = await (client.post(path, json=json) if json else client.get(path))
            codes.append(r.status_code)
            await asyncio.sleep(0.05)
    return codes


async def check_slow_clients_are_cut(url: str, header_s: float, body_s: float, *, path: str = "/health",
                                     json: dict | None = None, n: int = 400) -> None:
    stop = asyncio.Event()
    normal = asyncio.create_task(normal_requests_meanwhile(url, stop, path, json))
    started = time.monotonic()
    slow_heads = await trickle(url, n, interval=0.5, give_up=header_s + 20)
    stop.set()
    codes = await normal
    assert all(t is not None for t in slow_heads), f"{slow_heads.count(None)} of {n} slow clients stayed connected"
    closed = [t for t in slow_heads if t is not None]
    assert min(closed) >= header_s * 0.9, "closed before the header timeout"
    assert max(closed) < header_s + 15, max(closed)
    assert len(codes) >= 5 and set(codes) == {200}, codes
    # a slow body: headers at once, then a byte every 0.5 s
    head, body = slow_body(path if json else "/v1/completions")
    slow_bodies = await trickle(url, 20, prefix=head, payload=body, interval=0.5, give_up=body_s + 20)
    assert all(t is not None and t >= body_s * 0.9 for t in slow_bodies), slow_bodies
    # and a client whose headers come in pieces, just within the timeout, is served
    reader, writer = await asyncio.open_connection(*url.removeprefix("http://").split(":"))
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode() if not json else None
    if request is None:
        payload = httpx.Request("POST", url + path, json=json)
        request = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
                   f"Content-Length: {len(payload.content)}\r\n\r\n").encode() + payload.content
    for piece in (request[:10], request[10:30], request[30:]):
        writer.write(piece)
        await asyncio.sleep(header_s / 5)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert time.monotonic() - started < 120


async def test_folio_serve_closes_slow_clients(folio_bin: str, tiny_llama: Path, tmp_path: Path) -> None:
    serve = await asyncio.to_thread(start_serve, folio_bin, tiny_llama, tmp_path,
                                    "--header-timeout", "2", "--body-timeout", "3")
    try:
        await check_slow_clients_are_cut(serve.url, 2.0, 3.0, path="/v1/completions",
                                         json={"model": "m", "prompt": "hi", "max_tokens": 2})
        assert serve.proc.poll() is None
    finally:
        await asyncio.to_thread(stop_serve, serve)
