"""The streaming response for server-sent events."""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class EventStream(StreamingResponse):
    """A `text/event-stream` response that always closes its generator when the response ends.

    Starlette cancels the sending task when the client disconnects; closing the generator right then
    (instead of whenever it is garbage-collected) runs its `finally`, which aborts the sequences and
    frees their KV blocks at once.
    """

    def __init__(self, events: AsyncIterator[str], headers: dict[str, str] | None = None) -> None:
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache", **(headers or {})})
        self._events = events

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()  # type: ignore[attr-defined]
