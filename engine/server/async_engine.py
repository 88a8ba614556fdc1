"""Runs the blocking engine core in a thread of its own and fans its outputs out to asyncio streams.

Only the engine thread touches the engine: the event loop hands it commands (add, abort) that it runs
between two steps, and it hands back each step's outputs and a stats snapshot in one loop callback. So
the server never blocks on a step, and the engine never needs a lock.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from folio.engine.outputs import EngineStats, RequestOutput
from folio.engine.sampling_params import SamplingParams
from folio.engine.server.metrics import ServerMetrics

if TYPE_CHECKING:  # the engine core's module imports torch: `folio serve --help` and the operator need none
    from folio.engine.lora import LoRARequest
    from folio.engine.resume import Replay

T = TypeVar("T")
# Adapter names of the running requests, of the waiting ones (`EngineCore.lora_state`).
LoRAState = tuple[list[str], list[str]]

log = logging.getLogger("folio.server")


class EngineCore(Protocol):
    """The part of `folio.engine.llm_engine.LLMEngine` the server uses."""

    tokenizer: Any
    model_config: Any

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, group: str | None = None,
        resume: Replay | None = None, lora_request: LoRARequest | None = None, priority: int = 0,
    ) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished_requests(self) -> bool: ...
    def stats(self) -> EngineStats: ...
    # Multi-LoRA (`--enable-lora`): called only when the server serves adapters.
    def add_lora(self, request: LoRARequest) -> None: ...
    def remove_lora(self, name: str) -> bool: ...
    def list_loras(self) -> list[LoRARequest]: ...
    def lora_state(self) -> LoRAState: ...

    def lora_resident(self) -> list[str]: ...


class EngineDeadError(RuntimeError):
    """The engine thread stopped on an error; every request in flight fails with it."""


class RequestAborted(RuntimeError):
    """The server aborted the request (e.g. shutdown drain timed out)."""


class RequestFailed(RuntimeError):
    """A step running this request raised; the engine failed that step's requests and carries on."""


@dataclass
class EngineRequest:
    """One engine sequence of a client request (a request fans out to n × prompts sequences)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    group: str | None = None  # the client request's id: the engine queues requests fairly by it
    resume: Replay | None = None  # continue after output tokens the client has (replayed off the event loop)
    lora_request: LoRARequest | None = None  # the adapter it runs under; None: the base model
    priority: int = 0  # under the priority scheduling policy: lower first

    @property
    def model_name(self) -> str | None:
        """The adapter's name, which labels its metrics; None: the base model's."""
        return self.lora_request.lora_name if self.lora_request is not None else None


class RequestStream:
    """The outputs of one client request's sequences, in arrival order, until all have finished."""

    def __init__(self, request_ids: Sequence[str]) -> None:
        self.request_ids = list(request_ids)
        self._pending = set(request_ids)
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    @property
    def finished(self) -> bool:
        return not self._pending

    def put(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while self._pending:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            if item.error is not None:
                raise RequestFailed(f"The engine failed this request: {item.error}")
            if item.finished:
                self._pending.discard(item.request_id)
            yield item


_Reply = Callable[[], None]  # runs on the event loop once a command is done


class AsyncEngine:
    def __init__(
        self, engine: EngineCore, metrics_factory: Callable[[Callable[[], EngineStats]], ServerMetrics],
        observe: Callable[[list[RequestOutput]], None] | None = None, *, lora: bool = False,
    ):
        self.engine = engine
        self._observe = observe  # sees each step's outputs first (`admission.crash_after`, a fault)
        self._lora = lora  # whether to snapshot the engine's adapter state with its stats
        self.metrics = metrics_factory(lambda: self.stats)
        self.stats: EngineStats = engine.stats()
        self.lora_state: LoRAState = engine.lora_state() if lora else ([], [])
        self.lora_resident: list[str] = engine.lora_resident() if lora else []  # adapters in memory
        self.error: BaseException | None = None
        self._streams: dict[str, RequestStream] = {}
        self._pending_adds = 0
        self._adding: set[asyncio.Future[None]] = set()  # adds the engine thread has not answered yet
        self._cv = threading.Condition()
        self._commands: list[Callable[[], _Reply | None]] = []
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle (event loop side)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="folio-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the engine reports to (set by start())."""
        return self._loop

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread is not None and self._thread.is_alive()

    @property
    def num_queued(self) -> int:
        """Sequences not yet scheduled: being handed to the engine, or waiting in its queue."""
        return self._pending_adds + self.stats.num_waiting

    # ------------------------------------------------------------ requests (event loop side)

    async def generate(self, seqs: list[EngineRequest]) -> RequestStream:
        """Hands the sequences to the engine. Raises ValueError (bad input, nothing scheduled) or
        EngineDeadError; a cancelled caller leaves nothing behind."""
        if not self.alive:
            raise EngineDeadError(f"the engine is not running: {self.error!r}")
        ids = [s.request_id for s in seqs]
        stream = RequestStream(ids)
        for rid in ids:  # registered before the engine sees them, so no output can be missed
            self._streams[rid] = stream
        done: asyncio.Future[None] = self._loop.create_future()  # type: ignore[union-attr]

        def add() -> _Reply:
            added: list[str] = []
            try:
                for s in seqs:
                    # the keywords only when set: an engine without LoRA needs not know them
                    extra: dict[str, Any] = {"lora_request": s.lora_request} if s.lora_request is not None else {}
                    if s.priority:
                        extra["priority"] = s.priority
                    self.engine.add_request(s.request_id, s.prompt_token_ids, s.params, s.group, s.resume, **extra)
                    added.append(s.request_id)
            except Exception as exc:
                for rid in added:
                    self.engine.abort_request(rid)
                return lambda err=exc: done.done() or done.set_exception(err)
            return lambda: self._added(seqs, done)

        self._pending_adds += len(seqs)
        self._adding.add(done)
        try:
            self._submit(add)
            await done
        except BaseException:
            self.abort(ids, count=False)  # also covers a caller cancelled while the add was queued
            raise
        finally:
            self._pending_adds -= len(seqs)
            self._adding.discard(done)
        return stream

    def _added(self, seqs: list[EngineRequest], done: asyncio.Future[None]) -> None:
        # Runs before any step output of these sequences reaches the loop, so timings start first.
        if done.done():  # the caller gave up meanwhile and generate() aborted the sequences
            return
        for s in seqs:
            self.metrics.on_added(s.request_id, len(s.prompt_token_ids), s.model_name)
        done.set_result(None)

    async def call(self, fn: Callable[[], T]) -> T:
        """Runs ``fn`` (e.g. loading an adapter) on the engine thread between two steps, as only that thread
        may touch the engine; returns its result or raises its exception (EngineDeadError when the engine is
        not running)."""
        if not self.alive:
            raise EngineDeadError(f"the engine is not running: {self.error!r}")
        done: asyncio.Future[T] = self._loop.create_future()  # type: ignore[union-attr]

        def command() -> _Reply:
            try:
                result = fn()
            except Exception as exc:
                return lambda err=exc: done.done() or done.set_exception(err)
            return lambda: done.done() or done.set_result(result)

        self._adding.add(done)  # type: ignore[arg-type]  # failed like an add if the engine dies first
        try:
            self._submit(command)
            return await done
        finally:
            self._adding.discard(done)  # type: ignore[arg-type]

    def abort(self, request_ids: Sequence[str], *, count: bool = True) -> None:
        """Stops the sequences that have not finished and frees their KV blocks."""
        live = [rid for rid in request_ids if self._streams.pop(rid, None) is not None]
        if not live:
            return
        if count:
            for rid in live:
                self.metrics.on_aborted(rid)

        def abort() -> None:
            for rid in live:
                self.engine.abort_request(rid)

        self._submit(abort)

    def fail_from_thread(self, exc: BaseException) -> None:
        """From any thread: the engine cannot serve any more (e.g. a tensor-parallel rank died while the
        engine thread waits): fail what is in flight as a dead engine loop does."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_dead, exc)

    def abort_all(self, reason: BaseException) -> None:
        for stream in set(self._streams.values()):
            stream.put(reason)
        self.abort(list(self._streams))

    # ------------------------------------------------------------ engine thread

    def _submit(self, command: Callable[[], _Reply | None]) -> None:
        with self._cv:
            self._commands.append(command)
            self._cv.notify()

    def _run(self) -> None:
        loop = self._loop
        assert loop is not None
        busy = False
        try:
            while True:
                with self._cv:
                    while not (self._commands or busy or self._stopping):
                        self._cv.wait()
                    if self._stopping:
                        return
                    commands, self._commands = self._commands, []
                if commands:
                    replies = [r for r in (c() for c in commands) if r is not None]
                    loop.call_soon_threadsafe(self._on_commands, replies, *self._snapshot())
                if self.engine.has_unfinished_requests():
                    outputs = self.engine.step()
                    loop.call_soon_threadsafe(self._on_step, outputs, *self._snapshot())
                busy = self.engine.has_unfinished_requests()
        except BaseException as exc:  # a broken engine must fail its requests, not hang them
            log.exception("engine step failed; failing every request in flight")
            loop.call_soon_threadsafe(self._on_dead, exc)

    def _snapshot(self) -> tuple[EngineStats, LoRAState, list[str]]:
        """The engine's stats and adapter state, read on the engine thread for the loop's metrics."""
        if not self._lora:
            return self.engine.stats(), ([], []), []
        return self.engine.stats(), self.engine.lora_state(), self.engine.lora_resident()

    # ------------------------------------------------------------ engine thread -> event loop

    def _on_commands(self, replies: list[_Reply], stats: EngineStats, lora: LoRAState, resident: list[str]) -> None:
        self.stats, self.lora_state, self.lora_resident = stats, lora, resident
        for reply in replies:
            reply()

    def _on_step(self, outputs: list[RequestOutput], stats: EngineStats, lora: LoRAState,
                 resident: list[str]) -> None:
        self.stats, self.lora_state, self.lora_resident = stats, lora, resident
        if self._observe is not None:
            self._observe(outputs)
        now = time.monotonic()
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:  # aborted meanwhile
                continue
            self.metrics.on_output(out, now)
            stream.put(out)
            if out.finished:
                del self._streams[out.request_id]

    def _on_dead(self, exc: BaseException) -> None:
        self.error = exc
        err = EngineDeadError(f"the engine failed: {type(exc).__name__}: {exc}")
        for stream in set(self._streams.values()):
            stream.put(err)
        self._streams.clear()
        for done in self._adding:
            if not done.done():
                done.set_exception(err)
