"""What /v1/completions and /v1/chat/completions share: model and capacity checks, turning a request
into engine sequences with validated sampling parameters, and answering it (a stream of chunks or one
response, worded by the endpoint's renderer) until the end or a client disconnect."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from folio.engine import rules
from folio.engine.lora import LoRAError, LoRARequest
from folio.engine.outputs import RequestOutput, merge_outputs
from folio.engine.sampling_params import SamplingParams, offset_seed
from folio.engine.server import structured
from folio.engine.server.async_engine import (
    AsyncEngine,
    EngineDeadError,
    EngineRequest,
    RequestAborted,
    RequestFailed,
    RequestStream,
)
from folio.engine.server.choices import Choices, Event, Prompt, Renderer, choice_indexes
from folio.engine.server.continuation import CREATED_HEADER, RESPONSE_ID_HEADER, RESUMABLE_HEADER, Record
from folio.engine.server.errors import OpenAIError, bad_request, rejected, unavailable
from folio.engine.server.lora import LoRARegistry
from folio.engine.server.openai_errors import ErrorCode
from folio.engine.server.protocol import SamplingRequest
from folio.engine.server.resumption import Against, Resumption, prepare
from folio.engine.server.sse import EventStream
from folio.engine.tools.parsers import PARSERS

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
    enable_lora: bool = False  # serve adapters: a request's model may name one (`folio.engine.server.lora`)
    max_loras: int = 1  # adapters active at once on the device (the lora info metric's max_lora)
    allow_runtime_lora_updating: bool = False  # POST /v1/load_lora_adapter and /v1/unload_lora_adapter
    fault_adapter_files: bool = False  # test aid: adapters with a fault file answer errors (`adapter_faults`)
    # --tool-call-parser as resolved (the flag, else the model family's default); None: no "auto" tool choice
    tool_call_parser: str | None = None


log = logging.getLogger(__name__)

class OpenAIServing:
    def __init__(self, engine: AsyncEngine, config: ServingConfig) -> None:
        self.engine = engine
        self.config = config
        self.tokenizer = engine.engine.tokenizer
        self.vocab_size: int | None = getattr(engine.engine.model_config, "vocab_size", None)
        # the adapters loaded before serving (`folio serve --lora-modules`) are the engine's already
        loaded = engine.engine.list_loras() if config.enable_lora else []
        self.loras = LoRARegistry(engine, config.served_model_name, enabled=config.enable_lora, loaded=loaded,
                                  fault_files=config.fault_adapter_files)
        self.tool_parser = PARSERS[config.tool_call_parser]() if config.tool_call_parser else None

    # ------------------------------------------------------------------ checks

    def check_model(self, name: str | None) -> LoRARequest | None:
        """The adapter a request's ``model`` names; None for the base model; a 404 for anything else."""
        if name is None or name == self.config.served_model_name:
            return None
        lora = self.loras.get(name)
        if lora is None:
            raise model_not_found(name, self.config.served_model_name)
        return lora

    def model_name(self, lora: LoRARequest | None) -> str:
        """The ``model`` an answer names: the adapter's, else the served model's."""
        return self.loras.served_name(lora) if lora is not None else self.config.served_model_name

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

    def check_common(self, req: SamplingRequest) -> LoRARequest | None:
        """What the request models cannot know: the model served (returns the adapter ``model`` names, if
        any), this server's --max-n; and what it does not serve. The fields' own ranges were checked as the
        body was read (`protocol`)."""
        lora = self.check_model(req.model)
        if lora is not None:  # the API's requests only: like --fault-error-rate, the parity gate's take no fault
            self.loras.check_fault(lora)
        rules.Bound(1, self.config.max_n, integer=True, note=" (--max-n)").check("n", req.n)
        try:  # the constraint's and the bias's own form; `compile_constraint` then compiles the constraint
            structured.constraint(req)
            structured.logit_bias(req)
        except rules.RuleError as exc:
            raise rejected(exc) from exc
        return lora

    async def compile_constraint(self, req: SamplingRequest) -> None:
        """Compiles the request's structured-output constraint (cached by constraint) in a worker thread,
        before anything is queued, so the engine's step loop finds it compiled; a constraint that does not
        compile, or not in time, is a 400 naming its field."""
        constraint = structured.constraint(req)
        if constraint is None:
            return
        try:
            await self.off_loop(self.engine.engine.grammars.compile, constraint)
        except rules.RuleError as exc:
            raise rejected(exc) from exc

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

    def priority(self, req: SamplingRequest, raw: Request) -> int:
        """The request's priority: its tenant's when the router names one (`rules.PRIORITY_HEADER`), else its own."""
        header = raw.headers.get(rules.PRIORITY_HEADER)
        if header is None:
            return req.priority
        config = getattr(self.engine.engine, "config", None)
        if getattr(config, "scheduling_policy", "fcfs") != "priority":
            return 0
        try:
            return int(header)
        except ValueError:  # the router's own header: only a bug would garble it, and no client is to blame
            log.warning("ignoring a malformed %s header: %r", rules.PRIORITY_HEADER, header[:40])
            return 0

    # ------------------------------------------------------------------ sequences

    def sequences(
        self,
        request_id: str,
        prompts: list[Prompt],
        req: SamplingRequest,
        max_tokens: list[int],
        logprobs: int | None,
        prompt_logprobs: int | None = None,
        resumption: Resumption | None = None,
        lora: LoRARequest | None = None,
        priority: int | None = None,
    ) -> list[EngineRequest]:
        """n sequences per prompt, under adapter ``lora`` if any; choice index = prompt index * n + k, seed + k
        when seeded. A continuation runs no finished choice, and the carried ones from their replays (their
        prompt logprobs are carried). ``priority``: in place of the request's (`OpenAIServing.priority`)."""
        priority = req.priority if priority is None else priority
        seqs: list[EngineRequest] = []
        for i in choice_indexes(len(prompts) * req.n, resumption):
            carried = resumption.carried.get(i) if resumption is not None else None
            params = self.choice_params(req, i, max_tokens, logprobs, None if carried else prompt_logprobs)
            resume = carried.replay if carried is not None else None
            seqs.append(EngineRequest(f"{request_id}-{i}", prompts[i // req.n].token_ids, params, request_id, resume,
                                      lora, priority=priority))  # fmt: skip
        return seqs

    def choice_params(
        self, req: SamplingRequest, index: int, max_tokens: list[int], logprobs: int | None,
        prompt_logprobs: int | None = None,
    ) -> SamplingParams:
        """Choice ``index``'s sampling parameters (k = index mod n: seed + k)."""
        p, k = divmod(index, req.n)
        return self._params(
            req, seed=offset_seed(req.seed, k), max_tokens=max_tokens[p], logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )  # fmt: skip

    async def resumption(
        self, req: SamplingRequest, prompts: list[Prompt], max_tokens: list[int], logprobs: int | None,
        *, echo: bool = False,
    ) -> Resumption | None:
        """The request's continuation (`folio.engine.server.continuation`), checked and replayed off the
        event loop; None when it continues nothing."""
        if req.folio_resume is None:
            return None
        return await self.off_loop(
            lambda: prepare(
                req.folio_resume, prompts, req.n,  # type: ignore[arg-type]
                lambda i: self.choice_params(req, i, max_tokens, logprobs),
                Against(
                    tokenizer=self.tokenizer, vocab_size=self.vocab_size,
                    eos_token_ids=getattr(self.engine.engine, "eos_token_ids", frozenset()),
                    max_model_len=self.config.max_model_len,
                    need_logprobs=logprobs is not None and not req.stream,
                    need_prompt_logprobs=echo and logprobs is not None and not req.stream,
                ),
            )
        )  # fmt: skip

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
            logit_bias=structured.logit_bias(req),
            structured_outputs=structured.constraint(req),
        )

    async def engine_stream(self, seqs: list[EngineRequest]) -> RequestStream:
        """Hands the sequences to the engine; maps its refusals to OpenAI errors."""
        self.check_capacity(len(seqs))  # again, with no await since: tokenizing ran off the loop meanwhile
        try:
            return await self.engine.generate(seqs)
        except rules.RuleError as exc:  # what only the engine knows, e.g. a request past its KV cache
            raise rejected(exc) from exc
        except LoRAError as exc:
            raise self._lora_refused(seqs, exc) from exc
        except ValueError as exc:
            raise bad_request(str(exc)) from exc
        except EngineDeadError as exc:
            raise unavailable(str(exc), code=ErrorCode.ENGINE_UNAVAILABLE) from exc

    def _lora_refused(self, seqs: list[EngineRequest], exc: LoRAError) -> OpenAIError:
        """The engine refused a request's adapter: unloaded while the request was being prepared (404, as
        for a request that arrives after the unload), else a 400 in the engine's words."""
        lora = seqs[0].lora_request if seqs else None
        if lora is not None and self.loras.get(lora.lora_name) != lora:
            return model_not_found(lora.lora_name, self.config.served_model_name)
        return bad_request(str(exc), param="model")

    async def respond(
        self, raw: Request, req: SamplingRequest, seqs: list[EngineRequest], choices: Choices, renderer: Renderer
    ) -> Response:
        """Runs the sequences and answers with ``renderer``'s words: server-sent events when the request
        streams, else one JSON response once every sequence has finished. In the resumable mode
        (``choices.records``) an unstreamed answer is an event stream too: records, then the response."""
        headers = _resumable_headers(renderer) if choices.records else None
        if req.stream:
            stream = await self.engine_stream(seqs)

            def render(out: RequestOutput) -> Iterable[Event]:
                return choices.stream(out, renderer)

            def tail() -> Iterable[Event]:
                if req.stream_options and req.stream_options.include_usage:
                    yield None, renderer.usage_chunk(choices.usage)

            return EventStream(self.sse(stream, render, tail, records=choices.records), headers)
        if choices.records:
            return EventStream(self._recorded_whole(await self.engine_stream(seqs), choices, renderer), headers)
        pieces = choices.whole(await self.run_to_end(raw, seqs))
        return JSONResponse(renderer.response(pieces, choices.usage).model_dump(mode="json"))

    def _recorded_whole(self, stream: RequestStream, choices: Choices, renderer: Renderer) -> AsyncIterator[str]:
        """An unstreamed answer in the resumable mode: a record per step output, then the whole JSON
        response, byte for byte as `respond` answers it otherwise, and no ``[DONE]``."""
        steps: dict[str, list[RequestOutput]] = {rid: [] for rid in stream.request_ids}

        def render(out: RequestOutput) -> Iterable[tuple[Record, None]]:
            steps[out.request_id].append(out)
            yield choices.record(out), None

        def tail() -> Iterable[tuple[None, str]]:
            pieces = choices.whole({rid: merge_outputs(outs) for rid, outs in steps.items()})
            body = JSONResponse(renderer.response(pieces, choices.usage).model_dump(mode="json")).body
            yield None, bytes(body).decode()

        return self.sse(stream, render, tail, records=True, done=False)

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
        render: Callable[[RequestOutput], Iterable[tuple[Record | None, _Item | None]]],
        tail: Callable[[], Iterable[tuple[Record | None, _Item | None]]],
        *,
        records: bool = False,
        done: bool = True,
    ) -> AsyncIterator[str]:
        """Server-sent events: one per rendered (record, item), an error event if the engine gives out (in
        the resumable mode, ``records``, with a ``failed`` record), then `[DONE]` unless not ``done``.
        Closing the generator (client gone) aborts the sequences still running."""
        try:
            try:
                async for out in stream:
                    for record, item in render(out):
                        yield _event(item, record)
                for record, item in tail():
                    yield _event(item, record)
            except _STREAM_ERRORS as exc:
                error = stream_error(exc)
                code = error.code or ErrorCode.INTERNAL_ERROR  # stream_error names one; never a bare None
                failed = Record(failed=code.value, message=error.message) if records else None
                yield _event(error.body(), failed)
            if done:
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


def model_not_found(name: str, served: str) -> OpenAIError:
    return OpenAIError(
        404, f"The model '{name}' does not exist; this server serves '{served}'.", param="model",
        code=ErrorCode.MODEL_NOT_FOUND,
    )  # fmt: skip


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def answered_as(request_id: str, resumption: Resumption | None) -> tuple[str, int | None]:
    """The id and created the client sees: those of the answer a continuation continues, else ``request_id``
    and None (now). The engine's sequences keep ``request_id``'s own ids either way."""
    return (resumption.id, resumption.created) if resumption is not None else (request_id, None)


_Item = BaseModel | dict[str, Any] | str  # a chunk, an error body, or JSON text as it is


def _event(item: _Item | None, record: Record | None = None) -> str:
    """One event: the record's comment line (if any), then the item's data line (if any)."""
    head = record.line() if record is not None else ""
    if item is None:
        assert record is not None, "an event needs a record or data"
        return head + "\n"
    data = item if isinstance(item, str) else item.model_dump_json() if isinstance(item, BaseModel) else json.dumps(item)
    return f"{head}data: {data}\n\n"


def _resumable_headers(renderer: Renderer) -> dict[str, str]:
    return {RESUMABLE_HEADER: "1", RESPONSE_ID_HEADER: renderer.request_id, CREATED_HEADER: str(renderer.created)}


def resumable(raw: Request) -> bool:
    """Whether the router asks for the resumable mode (`folio.engine.server.continuation`)."""
    return raw.headers.get(RESUMABLE_HEADER) == "1"


async def _wait_disconnect(raw: Request) -> None:
    # The body has been read, so the next ASGI message is the disconnect (if the client leaves).
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return
