"""The OpenAI error vocabulary of every Folio server, the engine's and the router's alike.

A body is ``{"error": {"message", "type", "param", "code"}}``. As in OpenAI's API, ``type`` says whose
fault it is: every 4xx is an ``invalid_request_error`` (a bad API key too: code ``invalid_api_key``),
every 5xx a ``server_error``; ``code`` says which error it is. Plain Python, with no web framework, so
that the router (aiohttp) need not import the engine server's FastAPI to use it.
"""

from __future__ import annotations

from typing import Any

INVALID_REQUEST_ERROR = "invalid_request_error"
SERVER_ERROR = "server_error"

# The code of an answer that names none, for statuses that need no further word.
DEFAULT_CODES = {404: "not_found", 405: "method_not_allowed", 500: "internal_error"}


def error_type(status: int) -> str:
    return INVALID_REQUEST_ERROR if status < 500 else SERVER_ERROR


def error_body(status: int, message: str, *, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    error = {"message": message, "type": error_type(status), "param": param, "code": code or DEFAULT_CODES.get(status)}
    return {"error": error}
