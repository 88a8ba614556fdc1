"""Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    502: "upstream_error",
    503: "service_unavailable",
}


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> bytes:
    err = {"message": message, "type": _TYPES.get(status, "api_error"), "param": param, "code": code}
    return json.dumps({"error": err}).encode()


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return web.Response(
        status=status,
        body=error_body(status, message, code, param),
        content_type="application/json",
        headers=headers,
    )
