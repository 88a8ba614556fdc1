"""Header and body read timeouts for HTTP/1.1 servers: slow-loris connections are closed.

Neither uvicorn nor aiohttp bounds how long a client may take to send a request: their keep-alive
timers only run while a connection is silent, so a client trickling one byte at a time holds a
connection (and its buffers) for ever. `GuardedProtocol` wraps any asyncio HTTP/1.1 server
protocol, follows the request framing in the bytes it receives (header block, then a
Content-Length or chunked body) and closes the connection when a request's headers take longer
than `header_s` to arrive, counted from the connection's start or the request's first byte, or its
body longer than `body_s` from the end of its headers. Between requests (a response being written,
an idle keep-alive connection) no timer runs: that is the server's own keep-alive timeout.

The engine (`folio serve`, uvicorn) and the router (`folio router`, aiohttp) both install it;
the cost is a scan for the end of the header block and a subtraction per body chunk.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_HEADER_S = 10.0
DEFAULT_BODY_S = 60.0
MAX_HEAD_BYTES = 64 * 1024  # beyond this the server's own parser refuses the request; stop tracking


@dataclass(frozen=True)
class ReadTimeouts:
    header_s: float = DEFAULT_HEADER_S
    body_s: float = DEFAULT_BODY_S

    def __post_init__(self) -> None:
        if not (self.header_s > 0 and self.body_s > 0):
            raise ValueError(f"read timeouts must be > 0, got header {self.header_s}, body {self.body_s}")


class RequestFraming:
    """Where a connection's incoming byte stream stands: between requests, in a header block, in a body.

    Bytes it cannot make sense of (a malformed head) leave it `lost`: the server's parser answers
    those, and the connection is not timed any more.
    """

    IDLE, HEAD, BODY, CHUNK_SIZE, CHUNK_DATA, CHUNK_END, TRAILERS, LOST = range(8)

    def __init__(self) -> None:
        self.state = self.IDLE
        self._head = bytearray()  # the header block (or chunk-size/trailer line) read so far
        self._left = 0  # body or chunk bytes still to come

    @property
    def in_head(self) -> bool:
        return self.state == self.HEAD

    @property
    def in_body(self) -> bool:
        return self.state in (self.BODY, self.CHUNK_SIZE, self.CHUNK_DATA, self.CHUNK_END, self.TRAILERS)

    def feed(self, data: bytes) -> None:
        pos, n = 0, len(data)
        while pos < n and self.state != self.LOST:
            pos = self._step(data, pos)

    def _step(self, data: bytes, pos: int) -> int:
        """Consume from ``data[pos:]`` what the current state takes; returns the new position."""
        state = self.state
        if state == self.IDLE:
            if data[pos] in (13, 10):  # blank lines between requests are allowed
                return pos + 1
            self.state = self.HEAD
            end = data.find(b"\r\n\r\n", pos)
            if end >= 0:  # the usual case: a whole head in one read, nothing to buffer
                self._start_body(data[pos:end + 4])
                return end + 4
            self._head = bytearray()
            return self._read_line_block(data, pos)
        if state in (self.HEAD, self.CHUNK_SIZE, self.TRAILERS):
            return self._read_line_block(data, pos)
        taken = min(self._left, len(data) - pos)
        self._left -= taken
        if self._left == 0:
            if state == self.BODY:
                self.state = self.IDLE
            elif state == self.CHUNK_DATA:
                self.state, self._left = self.CHUNK_END, 2  # the CRLF after the chunk's data
            else:
                self.state, self._head = self.CHUNK_SIZE, bytearray()
        return pos + taken

    def _read_line_block(self, data: bytes, pos: int) -> int:
        """Accumulate until the block's end: a blank line for heads and trailers, one line for a chunk size."""
        start = max(0, len(self._head) - 3)
        self._head += data[pos:] if pos else data
        end_mark = b"\r\n" if self.state == self.CHUNK_SIZE else b"\r\n\r\n"
        if self.state == self.TRAILERS and self._head.startswith(b"\r\n"):
            end = 2  # no trailers: just the final CRLF
        else:
            found = self._head.find(end_mark, start)
            if found < 0:
                if len(self._head) > MAX_HEAD_BYTES:
                    self.state = self.LOST
                return len(data)
            end = found + len(end_mark)
        rest = len(self._head) - end  # bytes of `data` past the block
        block, self._head = bytes(self._head[:end]), bytearray()
        if self.state == self.HEAD:
            self._start_body(block)
        elif self.state == self.CHUNK_SIZE:
            size = _chunk_size(block)
            if size is None:
                self.state = self.LOST
            elif size == 0:
                self.state = self.TRAILERS
            else:
                self.state, self._left = self.CHUNK_DATA, size
        else:  # trailers done: the request is complete
            self.state = self.IDLE
        return len(data) - rest

    def _start_body(self, head: bytes) -> None:
        lower = head.lower()
        chunked = _header(lower, b"transfer-encoding")
        if chunked is not None and b"chunked" in chunked:
            self.state, self._head = self.CHUNK_SIZE, bytearray()
            return
        length = _header(lower, b"content-length")
        try:
            self._left = int(length) if length is not None else 0
        except ValueError:
            self.state = self.LOST  # the server's parser answers it
            return
        self.state = self.BODY if self._left > 0 else self.IDLE


def _header(lower_head: bytes, name: bytes) -> bytes | None:
    """The value of header ``name`` in a lower-cased head block, or None."""
    at = lower_head.find(b"\r\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 3
    return lower_head[start:lower_head.find(b"\r\n", start)].strip()


def _chunk_size(line: bytes) -> int | None:
    try:
        return int(line.split(b";", 1)[0].strip(), 16)
    except ValueError:
        return None


class GuardedProtocol(asyncio.Protocol):
    """Wraps one HTTP server protocol instance; everything but the timing is the inner protocol's."""

    def __init__(self, inner: asyncio.Protocol, timeouts: ReadTimeouts) -> None:
        self.inner = inner
        self.timeouts = timeouts
        self.framing = RequestFraming()
        self._transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timing: str | None = None  # "header" or "body": what the running timer bounds

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._arm("header")  # a connection that never sends a request is a slow header too
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.framing.feed(data)
        self._follow()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def __getattr__(self, name: str) -> Any:  # e.g. uvicorn's `shutdown()` of its connections
        if name == "inner":  # not set yet: never recurse
            raise AttributeError(name)
        return getattr(self.inner, name)

    # --------------------------------------------------------------------- timing

    def _follow(self) -> None:
        """Check: which phase the stream is in now. Act: keep, start or stop the matching timer."""
        framing = self.framing
        wanted = "header" if framing.in_head else "body" if framing.in_body else None
        if wanted != self._timing:
            self._disarm()
            if wanted is not None:
                self._arm(wanted)

    def _arm(self, what: str) -> None:
        seconds = self.timeouts.header_s if what == "header" else self.timeouts.body_s
        self._timing = what
        self._timer = asyncio.get_running_loop().call_later(seconds, self._expire, what)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timing = None, None

    def _expire(self, what: str) -> None:
        self._timer, self._timing = None, None
        transport = self._transport
        if transport is not None and not transport.is_closing():
            peer = transport.get_extra_info("peername")
            log.info("closing the connection from %s: request %s not received within %.0f s", peer, what,
                     self.timeouts.header_s if what == "header" else self.timeouts.body_s)
            transport.abort()  # no response is owed for a request never received


def guarded_factory(factory: Callable[..., asyncio.Protocol], timeouts: ReadTimeouts) -> Callable[..., GuardedProtocol]:
    """A protocol factory like ``factory`` whose protocols are guarded (for `loop.create_server`)."""

    def make(*args: Any, **kwargs: Any) -> GuardedProtocol:
        return GuardedProtocol(factory(*args, **kwargs), timeouts)

    return make


def uvicorn_protocol(timeouts: ReadTimeouts) -> Callable[..., GuardedProtocol]:
    """For `uvicorn.Config(http=...)`: uvicorn's own HTTP/1.1 protocol, guarded."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return guarded_factory(AutoHTTPProtocol, timeouts)
