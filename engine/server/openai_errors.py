"""The OpenAI error vocabulary of every Folio server, the engine's and the router's alike.

A body is ``{"error": {"message", "type", "param", "code"}}``. As in OpenAI's API, ``type`` says whose
fault it is: every 4xx is an ``invalid_request_error`` (a bad API key too: code ``invalid_api_key``),
every 5xx a ``server_error``; ``code`` says which error it is, always one of `ErrorCode`. Plain Python,
with no web framework, so that the router (aiohttp) need not import the engine server's FastAPI to use
it; the OpenAPI model of the shape is derived from `ErrorBody` in `folio.engine.server.protocol`.
"""

from __future__ import annotations

from enum import StrEnum

from typing_extensions import TypedDict  # not typing's: pydantic reads it on Python < 3.12

INVALID_REQUEST_ERROR = "invalid_request_error"
SERVER_ERROR = "server_error"


class ErrorCode(StrEnum):
    """Every ``code`` a Folio server answers with. Clients match on these strings: add, never rename."""

    # the request itself (400, 413)
    INVALID_JSON = "invalid_json"  # not a JSON object (router and engine alike)
    INVALID_VALUE = "invalid_value"  # a parameter outside its rule (`folio.engine.rules`) or of the wrong type
    UNSUPPORTED_PARAMETER = "unsupported_parameter"  # valid OpenAI, but not served by Folio (or this model)
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    TOO_MANY_SEQUENCES = "too_many_sequences"  # n × prompts past --max-sequences-per-request
    BODY_TOO_LARGE = "body_too_large"
    # who and where (401, 404, 405)
    INVALID_API_KEY = "invalid_api_key"
    MODEL_NOT_FOUND = "model_not_found"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"  # 429: a tenant over its quota (spec.access)
    CLIENT_DISCONNECTED = "client_disconnected"  # 499: for the access log, nobody reads it
    # the engine (500, 503)
    INTERNAL_ERROR = "internal_error"
    FAULT_INJECTED = "fault_injected"  # --fault-error-rate
    SERVER_OVERLOADED = "server_overloaded"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    SHUTTING_DOWN = "shutting_down"
    # the router (502, 503, 504)
    NO_READY_REPLICA = "no_ready_replica"  # held while scaling from zero, and not served in time
    NO_UPSTREAM = "no_upstream"
    UPSTREAM_UNREACHABLE = "upstream_unreachable"
    UPSTREAM_TIMEOUT = "upstream_timeout"


# The code of an answer that names none, by status; any other status falls back on its class.
DEFAULT_CODES = {
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.BODY_TOO_LARGE,
    500: ErrorCode.INTERNAL_ERROR,
}


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: str | None
    code: str


class ErrorBody(TypedDict):
    """The one definition of the error shape (pydantic builds the OpenAPI model from it)."""

    error: ErrorDetail


def body_too_large_message(limit: int) -> str:
    """The 413's words, the router's and the engine's alike."""
    return f"request body is larger than {limit} bytes"


def error_type(status: int) -> str:
    return INVALID_REQUEST_ERROR if status < 500 else SERVER_ERROR


def default_code(status: int) -> ErrorCode:
    return DEFAULT_CODES.get(status, ErrorCode.INVALID_VALUE if status < 500 else ErrorCode.INTERNAL_ERROR)


def error_body(status: int, message: str, *, code: ErrorCode | None = None, param: str | None = None) -> ErrorBody:
    # ErrorCode(...) refuses a free string: every answer's code is one of the table's.
    word = default_code(status) if code is None else ErrorCode(code)
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": word.value}}
