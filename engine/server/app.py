"""The FastAPI application of one engine replica."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from folio.engine.server.admission import AdmissionMiddleware, Faults, ServerState, crash_after
from folio.engine.server.async_engine import AsyncEngine, EngineCore
from folio.engine.server.body_limit import BodyLimitMiddleware
from folio.engine.server.chat import create_chat_completion
from folio.engine.server.completions import create_completion
from folio.engine.server.errors import install_error_handlers
from folio.engine.server.metrics import ServerMetrics
from folio.engine.server.openai_errors import ErrorBody
from folio.engine.server.parity import PATH as PARITY_PATH
from folio.engine.server.parity import ParityRequest, ParityResponse, create_parity
from folio.engine.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
)
from folio.engine.server.serving import OpenAIServing, ServingConfig

# The one definition of the error shape (`openai_errors.ErrorBody`), as the OpenAPI document shows it.
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Invalid request"},
    404: {"model": ErrorBody, "description": "Unknown model"},
    413: {"model": ErrorBody, "description": "Body larger than --max-request-body-bytes"},
    500: {"model": ErrorBody, "description": "Injected fault (--fault-error-rate) or internal error"},
    503: {"model": ErrorBody, "description": "Queue full or shutting down; see Retry-After"},
}


def folio_version() -> str:
    try:
        return version("folio")
    except PackageNotFoundError:
        return "0.0.0+unknown"


def build_app(engine: EngineCore, config: ServingConfig, faults: Faults | None = None) -> FastAPI:
    """The app serving ``engine``. Its engine thread runs for the app's lifespan; ``app.state.server``
    is the ServerState (drain, in-flight count) that the process's signal handling drives."""
    faults = faults or Faults()
    crash = crash_after(faults.crash_after_tokens) if faults.crash_after_tokens else None
    async_engine = AsyncEngine(engine, lambda stats: ServerMetrics(config.served_model_name, stats), observe=crash)
    serving = OpenAIServing(async_engine, config)
    state = ServerState(async_engine, faults)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async_engine.start()
        try:
            yield
        finally:
            async_engine.stop()

    # /docs and /openapi.json describe the API to anyone who can reach the pod: off unless asked for.
    docs = {} if config.enable_docs else {"docs_url": None, "redoc_url": None, "openapi_url": None}
    app = FastAPI(title="Folio engine", version=folio_version(), lifespan=lifespan, **docs)
    app.state.server = state
    app.state.serving = serving
    install_error_handlers(app)
    app.add_middleware(AdmissionMiddleware, state=state)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_request_body_bytes)  # outermost: first

    @app.post(
        "/v1/completions",
        response_model=CompletionResponse,
        responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}}},
    )
    async def completions(body: CompletionRequest, raw: Request) -> Response:
        return await create_completion(serving, body, raw)

    @app.post(
        "/v1/chat/completions",
        response_model=ChatCompletionResponse,
        responses={**_ERRORS, 200: {"content": {"text/event-stream": {}}}},
    )
    async def chat_completions(body: ChatCompletionRequest, raw: Request) -> Response:
        return await create_chat_completion(serving, body, raw)

    @app.post(PARITY_PATH, response_model=ParityResponse, responses=_ERRORS)
    async def parity(body: ParityRequest, raw: Request) -> Response:
        """Folio's own: mean prompt logits and greedy continuations of a prompt suite (the parity gate)."""
        return await create_parity(serving, body, raw)

    @app.get("/v1/models", response_model=ModelList)
    async def models() -> ModelList:
        card = ModelCard(
            id=config.served_model_name,
            root=config.model_path,
            max_model_len=config.max_model_len,
            revision=config.revision,
            digest=config.digest,
        )
        return ModelList(data=[card])

    @app.get("/health")
    async def health() -> JSONResponse:
        # Liveness: the weights are loaded (the app exists only then) and the engine thread runs.
        if async_engine.alive:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "engine stopped", "error": repr(async_engine.error)}, status_code=503)

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if state.ready:
            return JSONResponse({"status": "ready"})
        status = "draining" if state.draining else "engine stopped"
        return JSONResponse({"status": status}, status_code=503, headers={"Retry-After": "1"})

    @app.get("/version")
    async def version_() -> dict[str, str]:
        return {"version": folio_version()}

    _add_metrics(app, async_engine)
    return app


def build_metrics_app(async_engine: AsyncEngine) -> FastAPI:
    """The app of `folio serve --metrics-port`: ``GET /metrics`` alone, the same text as the API's, so that a
    NetworkPolicy can admit a Prometheus scraper to this port without admitting it to the API."""
    app = FastAPI(title="folio engine metrics", docs_url=None, redoc_url=None, openapi_url=None)
    _add_metrics(app, async_engine)
    return app


def _add_metrics(app: FastAPI, async_engine: AsyncEngine) -> None:
    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(async_engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)
