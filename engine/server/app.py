"""The FastAPI application of one engine replica."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from folio.engine.lora import LoRARequest
from folio.engine.server.admission import AdmissionMiddleware, Faults, ServerState, crash_after
from folio.engine.server.async_engine import AsyncEngine, EngineCore
from folio.engine.server.body_limit import BodyLimitMiddleware
from folio.engine.server.chat import create_chat_completion
from folio.engine.server.completions import create_completion
from folio.engine.server.errors import install_error_handlers
from folio.engine.server.lora import runtime_updating_from_env, success_message
from folio.engine.server.metrics import ServerMetrics
from folio.engine.server.openai_errors import ErrorBody
from folio.engine.server.parity import PATH as PARITY_PATH
from folio.engine.server.parity import ParityRequest, ParityResponse, create_parity
from folio.engine.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    UnloadLoRAAdapterRequest,
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
    async_engine = AsyncEngine(
        engine, lambda stats: ServerMetrics(config.served_model_name, stats), observe=crash, lora=config.enable_lora
    )
    if config.enable_lora:
        async_engine.metrics.track_lora(config.max_loras, lambda: async_engine.lora_state,
                                        lambda: async_engine.lora_resident)
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
        adapters = [_adapter_card(lora, config) for lora in serving.loras.adapters()]
        return ModelList(data=[card, *adapters])

    if config.allow_runtime_lora_updating or runtime_updating_from_env():
        _add_lora_updating(app, serving)

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


def _adapter_card(lora: LoRARequest, config: ServingConfig) -> ModelCard:
    """An adapter as vLLM lists it: ``root`` its folder, ``parent`` the base model's served name."""
    return ModelCard(
        id=lora.lora_name, root=lora.lora_path, parent=config.served_model_name,
        max_model_len=config.max_model_len, digest=lora.digest,
    )  # fmt: skip


def _add_lora_updating(app: FastAPI, serving: OpenAIServing) -> None:
    """vLLM's runtime adapter endpoints; absent (404) unless --allow-runtime-lora-updating or
    VLLM_ALLOW_RUNTIME_LORA_UPDATING asks for them, as anyone who reaches the API could load files by path."""

    @app.post("/v1/load_lora_adapter", response_class=PlainTextResponse, responses=_ERRORS)
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> PlainTextResponse:
        await serving.loras.load(body.lora_name, body.lora_path, body.digest, body.served_name)
        return PlainTextResponse(success_message("added", body.lora_name))

    @app.post("/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=_ERRORS)
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> PlainTextResponse:
        await serving.loras.unload(body.lora_name)
        return PlainTextResponse(success_message("removed", body.lora_name))


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
