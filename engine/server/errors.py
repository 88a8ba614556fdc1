"""Errors in the OpenAI shape (`folio.engine.server.openai_errors`), and the handlers that make every
failure (including FastAPI's own validation errors and the rules' `RuleError`) come out that way, each
with a code from `ErrorCode`."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from folio.engine.rules import RuleError
from folio.engine.server.openai_errors import ErrorBody, ErrorCode, error_body, error_type

log = logging.getLogger("folio.server")

RETRY_AFTER_SECONDS = 1


class OpenAIError(Exception):
    """An error answered to the client; ``status`` picks the HTTP code."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: ErrorCode | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    @property
    def type(self) -> str:
        return error_type(self.status)

    def body(self) -> ErrorBody:
        return error_body(self.status, self.message, code=self.code, param=self.param)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: ErrorCode = ErrorCode.INVALID_VALUE) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def rejected(exc: RuleError) -> OpenAIError:
    """A broken rule (`folio.engine.rules`), answered in its own words."""
    return bad_request(exc.message, param=exc.param, code=exc.code)


def unavailable(message: str, code: ErrorCode) -> OpenAIError:
    return OpenAIError(503, message, code=code, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _param(loc: tuple[Any, ...]) -> str | None:
    """The parameter path of a pydantic error, without the union-member tags pydantic adds."""
    parts = [str(p) for p in loc if p != "body" and "[" not in str(p) and str(p) not in _TYPE_TAGS]
    return ".".join(parts) or None


def _describe(errors: list[dict[str, Any]]) -> tuple[str, str | None, ErrorCode]:
    """One readable sentence, the offending parameter and the code out of pydantic's error list."""
    # Our own checks (value_error) say more than the "not a string" of a union's other members.
    first = next((e for e in errors if e.get("type") == "value_error"), errors[0] if errors else {})
    if first.get("type") == "json_invalid":
        reason = first.get("ctx", {}).get("error", "could not parse")
        return f"Malformed JSON body: {reason}", None, ErrorCode.INVALID_JSON
    if tuple(first.get("loc", ())) == ("body",):  # the body as a whole: missing, or not an object
        return "The request body must be a JSON object.", None, ErrorCode.INVALID_JSON
    param = _param(tuple(first.get("loc", ())))
    others = {_param(tuple(e.get("loc", ()))) for e in errors} - {param}
    more = f" (also invalid: {', '.join(sorted(str(o) for o in others))})" if others else ""
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, RuleError):  # the rule's own words, as SamplingParams says them
        return f"{cause.message}{more}", param, cause.code
    where = f"'{param}'" if param else "the request body"
    said = str(cause) if isinstance(cause, ValueError) else first.get("msg", "invalid request")
    return f"Invalid value for {where}: {said}{more}", param, ErrorCode.INVALID_VALUE


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai(_: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI answers 422 by default; OpenAI clients expect 400 for any invalid input.
        message, param, code = _describe(list(exc.errors()))
        return bad_request(message, param=param, code=code).response()

    @app.exception_handler(RuleError)
    async def _rule(_: Request, exc: RuleError) -> JSONResponse:
        return rejected(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return OpenAIError(exc.status_code, str(exc.detail), headers=exc.headers).response()

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return OpenAIError(500, f"Internal server error: {type(exc).__name__}").response()
