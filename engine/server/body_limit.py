"""A request-body size limit in front of the app (`--max-request-body-bytes`).

The body is read here, up to the limit, before any route sees it: a larger body is answered with a
413 in the OpenAI shape (code ``body_too_large``, as the router words it) and never buffered whole.
The default is the router's too (`folio.engine.rules.DEFAULT_MAX_REQUEST_BODY_BYTES`).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from folio.engine.server.errors import OpenAIError
from folio.engine.server.openai_errors import ErrorCode, body_too_large_message


def too_large(limit: int) -> OpenAIError:
    return OpenAIError(413, body_too_large_message(limit), code=ErrorCode.BODY_TOO_LARGE)


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        assert max_bytes >= 1
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await too_large(self.max_bytes).response()(scope, receive, send)
            return
        # Chunked or lying bodies: count what arrives, and stop reading at the limit.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                await self.app(scope, _replay([message], receive), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await too_large(self.max_bytes).response()(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([body], receive), send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    async def replayed() -> Message:
        if messages:
            return messages.pop(0)
        return await receive()

    return replayed
