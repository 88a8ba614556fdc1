"""Slow-loris clients: raw loopback sockets that send a request one byte at a time, too slowly.

`trickle(url, n, ...)` opens ``n`` connections; each sends ``payload`` a byte every ``interval``
seconds and records how long after connecting the server closed it (None: still open when the
client gave up, or the payload ran out first). Used against the engine and the router.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from urllib.parse import urlsplit

# A request that never completes its header block: a long header value, trickled.
SLOW_HEADERS = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Pad: " + b"a" * 4096


def slow_body(path: str = "/v1/completions", length: int = 4096) -> tuple[bytes, bytes]:
    """A complete header block announcing a body, and that body (to trickle)."""
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()
    return head, b"{" + b" " * (length - 2) + b"}"


async def _one(host: str, port: int, prefix: bytes, payload: bytes, interval: float, give_up: float) -> float | None:
    start = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(prefix)
        for i in range(len(payload)):
            writer.write(payload[i:i + 1])
            try:
                await writer.drain()
                data = await asyncio.wait_for(reader.read(65536), interval)
            except asyncio.TimeoutError:
                data = None
            except (ConnectionResetError, BrokenPipeError):
                return time.monotonic() - start
            if data == b"":
                return time.monotonic() - start
            if time.monotonic() - start > give_up:
                return None
        return None
    finally:
        writer.close()
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            await writer.wait_closed()


async def trickle(url: str, n: int, *, payload: bytes = SLOW_HEADERS, prefix: bytes = b"", interval: float = 0.5,
                  give_up: float = 30.0) -> list[float | None]:
    """Run ``n`` slow clients at once against ``url``; the seconds until each was disconnected."""
    where = urlsplit(url)
    assert where.hostname and where.port
    return list(await asyncio.gather(*(
        _one(where.hostname, where.port, prefix, payload, interval, give_up) for _ in range(n)
    )))
