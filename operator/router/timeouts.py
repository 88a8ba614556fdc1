"""Attempt timeouts: how long an upstream may stay silent, and what the client sees when it does.

- The canary's attempts are held to the config's ``requestTimeout`` (the spec's
  ``analysis.requestTimeout``): no first byte within it, or a stream silent for longer, and the attempt
  is a timeout, counted as ``folio_router_requests_total{code="timeout"}`` and by outlier detection.
  Every other attempt (stable, overflow) is held to the router's read timeout the same way
  (``folio router --upstream-timeout``), so a non-streaming answer may take as long as a long
  generation needs.
- Before the first byte nothing has reached the client: the attempt is a failure like a refused
  connection, and the proxy retries it on stable.
- After it the status line is gone: an event stream is continued on another replica where it can be
  (`migration`; a resumable answer is then held to the shorter ``interChunkTimeout`` between chunks),
  else ends with an error event in the OpenAI shape (``data: {"error": …}``) and ``[DONE]``; anything
  else is cut off so that it cannot look complete.
- An answer that timed out everywhere it was tried is a 504 in the OpenAI error shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from folio.engine.server.openai_errors import ErrorCode
from folio.operator.metric_names import TIMEOUT
from folio.operator.router.errors import error_response
from folio.operator.serving.router import RouterConfig

GATEWAY_TIMEOUT = 504
ERROR_CODE = ErrorCode.UPSTREAM_TIMEOUT  # the OpenAI-shaped error's code

__all__ = ["TIMEOUT", "Stalled", "attempt_timeout", "next_chunk", "timed_out_response"]


def attempt_timeout(config: RouterConfig, revision: str, read_timeout: float) -> float:
    """Seconds ``revision``'s attempt may wait for its first byte, and then between chunks."""
    if revision == config.canary and revision != config.stable:
        return min(config.request_timeout_seconds, read_timeout)
    return read_timeout


class Stalled(Exception):
    """The upstream sent nothing for ``seconds`` in the middle of its answer."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no byte for {seconds:g}s mid-response")
        self.seconds = seconds


async def next_chunk(chunks: AsyncIterator[bytes], seconds: float) -> bytes | None:
    """The next chunk of an answer, None at its end; `Stalled` after ``seconds`` of silence."""
    try:
        async with asyncio.timeout(seconds):
            return await anext(chunks)
    except StopAsyncIteration:
        return None
    except TimeoutError as exc:
        raise Stalled(seconds) from exc


def timed_out_response(reason: str) -> web.Response:
    return error_response(GATEWAY_TIMEOUT, f"no upstream answered in time: {reason}", code=ERROR_CODE)
