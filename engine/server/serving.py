"""What /v1/completions and /v1/chat/completions share: model and capacity checks, turning a request
into engine sequences with validated sampling parameters, and answering it (a stream of chunks or one
response, worded by the endpoint's renderer) until the end or a client disconnect."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from folio.engine import rules
from folio.engine.outputs import RequestOutput, merge_outputs
from folio.engine.sampling_params import SamplingParams, offset_seed
from folio.engine.server.async_engine import (
    AsyncEngine,
    EngineDeadError,
    EngineRequest,
    RequestAborted,
    RequestFailed,
    RequestStream,
)
from folio.engine.server.choices import Choices, Prompt, Renderer
from folio.engine.server.errors import OpenAIError, bad_request, rejected, unavailable
from folio.engine.server.openai_errors import ErrorCode
from folio.engine.server.protocol import SamplingRequest
from folio.engine.server.sse import EventStream

T = TypeVar("T")


@dataclass(frozen=True)
class ServingConfig:
    served_model_name: str
    model_path: str
    max_model_len: int
    max_n: int = 8
    max_queued_requests: int = 256
    max_sequences_per_request: int = 64
    max_request_body_bytes: int = rules.DEFAULT_MAX_REQUEST_BODY_BYTES
    enable_docs: bool = False
    revision: str | None = None
    digest: str | None = None


class OpenAIServing:
    def __init__(self, engine: AsyncEngine, config: ServingConfig) -> None:
        self.engine = engine
        self.config = config
        self.tokenizer = engine.engine.tokenizer
        self.vocab_size: int | None = getattr(engine.engine.model_config, "vocab_size", None)

    # ------------------------------------------------------------------ checks

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.config.served_model_name:
            raise OpenAIError(
                404,
                f"The model '{name}' does not exist; this server serves '{self.config.served_model_name}'.",
                param="model",
                code=ErrorCode.MODEL_NOT_FOUND,
            )

    def check_capacity(self, new_sequences: int) -> None:
        """503 when ``new_sequences`` more would take the engine's queue past --max-queued-requests
        (which counts sequences: a request adds n × prompts of them)."""
        queued = self.engine.num_queued
        if queued + new_sequences > self.config.max_queued_requests:
            raise unavailable(
                f"Server overloaded: {queued} sequences are queued and this request adds {new_sequences} "
                f"(limit {self.config.max_queued_requests}); retry later.",
                code=ErrorCode.SERVER_OVERLOADED,
            )

    def check_sequences(self, count: int) -> None:
        """A request's n × prompts: a 400 beyond --max-sequences-per-request (or beyond what the queue
        could ever hold), else the queue's room for them."""
        cap = min(self.config.max_sequences_per_request, self.config.max_queued_requests)
        if count > cap:
            raise bad_request(
                f"This request asks for {count} sequences (n × prompts); at most {cap} are allowed per request.",
                param="n",
                code=ErrorCode.TOO_MANY_SEQUENCES,
            )
        self.check_capacity(count)

    def check_common(self, req: SamplingRequest) -> None:
        """What the request models cannot know: the model served, this server's --max-n; and what it
        does not serve. The fields' own ranges were checked as the body was read (`protocol`)."""
        self.check_model(req.model)
        rules.Bound(1, self.config.max_n, integer=True, note=" (--max-n)").check("n", req.n)
        if req.logit_bias:
            raise bad_request("logit_bias is not supported.", param="logit_bias", code=ErrorCode.UNSUPPORTED_PARAMETER)

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Runs CPU-heavy request preparation (tokenizing, chat templates) in a worker thread, so that a
        large prompt never holds up the event loop (/health, other requests' streams)."""
        return await asyncio.to_thread(fn, *args)

    def tokenize(self, text: str, *, add_special_tokens: bool, param: str) -> list[int]:
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))
        except Exception as exc:  # the request's text, not the server, is at fault
            raise bad_request(f"The text could not be tokenized: {exc}", param=param) from exc

    def check_token_ids(self, ids: list[int], param: str) -> None:
        rules.check_prompt_ids(ids, self.vocab_size, param)

    def max_tokens(
        self, requested: int | None, default: int | None, prompt_len: int, *, param: str, prompt_param: str
    ) -> int:
        """The completion budget; a 400 stating both figures when the request cannot fit the context.
        ``param``/``prompt_param`` name the field to blame when the budget/the prompt alone is too long."""
        limit = self.config.max_model_len
        room = limit - prompt_len
        if requested is None:
            wanted = room if default is None else min(default, room)
            if wanted >= 1:
                return wanted
            requested = default or 1
        rules.check_context(prompt_len, requested, limit, param=param, prompt_param=prompt_param)
        return requested

    # ------------------------------------------------------------------ sequences

    def sequences(
        self,
        request_id: str,
        prompts: list[Prompt],
        req: SamplingRequest,
        max_tokens: list[int],
        logprobs: int | None,
        prompt_logprobs: int | None = None,
    ) -> list[EngineRequest]:
        """n sequences per prompt; choice index = prompt index * n + k, seed + k when seeded."""
        seqs: list[EngineRequest] = []
        for p, (prompt, budget) in enumerate(zip(prompts, max_tokens, strict=True)):
            for k in range(req.n):
                params = self._params(
                    req, seed=offset_seed(req.seed, k), max_tokens=budget, logprobs=logprobs,
                    prompt_logprobs=prompt_logprobs,
                )
                seqs.append(EngineRequest(f"{request_id}-{p * req.n + k}", prompt.token_ids, params, request_id))
        return seqs

    @staticmethod
    def _params(
        req: SamplingRequest, *, seed: int | None, max_tokens: int, logprobs: int | None,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        # Every field was checked against the same rules when the request was read: this cannot fail.
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k is None else req.top_k,
            min_p=req.min_p or 0.0,
            repetition_penalty=req.repetition_penalty,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            seed=seed,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids or [],
            max_tokens=max_tokens,
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=req.skip_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output,
        )

    async def engine_stream(self, seqs: list[EngineRequest]) -> RequestStream:
        """Hands the sequences to the engine; maps its refusals to OpenAI errors."""
        self.check_capacity(len(seqs))  # again, with no await since: tokenizing ran off the loop meanwhile
        try:
            return await self.engine.generate(seqs)
        except rules.RuleError as exc:  # what only the engine knows, e.g. a request past its KV cache
            raise rejected(exc) from exc
        except ValueError as exc:
            raise bad_request(str(exc)) from exc
        except EngineDeadError as exc:
            raise unavailable(str(exc), code=ErrorCode.ENGINE_UNAVAILABLE) from exc

    async def respond(
        self, raw: Request, req: SamplingRequest, seqs: list[EngineRequest], choices: Choices, renderer: Renderer
    ) -> Response:
        """Runs the sequences and answers with ``renderer``'s words: server-sent events when the request
        streams, else one JSON response once every sequence has finished."""
        if req.stream:
            stream = await self.engine_stream(seqs)

            def render(out: RequestOutput) -> Iterable[BaseModel]:
                return choices.stream(out, renderer)

            def tail() -> Iterable[BaseModel]:
                if req.stream_options and req.stream_options.include_usage:
                    yield renderer.usage_chunk(choices.usage)

            return EventStream(self.sse(stream, render, tail))
        pieces = choices.whole(await self.run_to_end(raw, seqs))
        return JSONResponse(renderer.response(pieces, choices.usage).model_dump(mode="json"))

    async def run_to_end(self, raw: Request, seqs: list[EngineRequest]) -> dict[str, RequestOutput]:
        """The whole output per sequence id; aborts everything if the client disconnects first."""
        stream = await self.engine_stream(seqs)
        ids = stream.request_ids

        async def collect() -> dict[str, RequestOutput]:
            steps: dict[str, list[RequestOutput]] = {rid: [] for rid in ids}
            async for out in stream:
                steps[out.request_id].append(out)
            return {rid: merge_outputs(outs) for rid, outs in steps.items()}

        work = asyncio.ensure_future(collect())
        gone = asyncio.ensure_future(_wait_disconnect(raw))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not work.done():
                work.cancel()
                self.engine.abort(ids)
        if not work.done() or work.cancelled():
            # Nobody reads this answer; 499 is nginx's "client closed request", for the access log.
            raise OpenAIError(499, "The client disconnected.", code=ErrorCode.CLIENT_DISCONNECTED)
        try:
            return work.result()
        except _STREAM_ERRORS as exc:
            raise stream_error(exc) from exc

    async def sse(
        self,
        stream: RequestStream,
        render: Callable[[RequestOutput], Iterable[BaseModel | dict[str, Any]]],
        tail: Callable[[], Iterable[BaseModel | dict[str, Any]]],
    ) -> AsyncIterator[str]:
        """Server-sent events: a chunk per rendered item, an error event if the engine gives out, then
        `[DONE]`. Closing the generator (client gone) aborts the sequences still running."""
        try:
            try:
                async for out in stream:
                    for item in render(out):
                        yield _event(item)
                for item in tail():
                    yield _event(item)
            except _STREAM_ERRORS as exc:
                yield _event(stream_error(exc).body())
            yield "data: [DONE]\n\n"
        finally:
            self.engine.abort(stream.request_ids)


_STREAM_ERRORS = (EngineDeadError, RequestAborted, RequestFailed)


def stream_error(exc: EngineDeadError | RequestAborted | RequestFailed) -> OpenAIError:
    """How a request that the engine could not finish is answered (as the response or a final event)."""
    if isinstance(exc, RequestFailed):  # the engine is fine; this request's step raised (and was logged)
        return OpenAIError(500, str(exc), code=ErrorCode.INTERNAL_ERROR)
    code = ErrorCode.SHUTTING_DOWN if isinstance(exc, RequestAborted) else ErrorCode.ENGINE_UNAVAILABLE
    return unavailable(str(exc), code=code)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _event(item: BaseModel | dict[str, Any]) -> str:
    data = item.model_dump_json() if isinstance(item, BaseModel) else json.dumps(item)
    return f"data: {data}\n\n"


async def _wait_disconnect(raw: Request) -> None:
    # The body has been read, so the next ASGI message is the disconnect (if the client leaves).
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return
