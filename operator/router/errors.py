"""Errors in the OpenAI shape, with the engine's vocabulary (`folio.engine.server.openai_errors`): every
code is an `ErrorCode`, so a client matches the router's answers and the engine's with the same strings."""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web

from folio.engine.server import openai_errors
from folio.engine.server.openai_errors import ErrorCode


def error_body(status: int, message: str, code: ErrorCode | None = None, param: str | None = None) -> bytes:
    return json.dumps(openai_errors.error_body(status, message, code=code, param=param)).encode()


def error_response(
    status: int,
    message: str,
    *,
    code: ErrorCode | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return web.Response(
        status=status,
        body=error_body(status, message, code, param),
        content_type="application/json",
        headers=headers,
    )
