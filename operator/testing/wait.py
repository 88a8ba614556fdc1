"""Polling with a deadline: wait for the state needed, never for a fixed duration.

`wait_for` (threads, subprocesses) and `until` (asyncio) call ``condition`` until it returns something
truthy, which they return; past ``timeout`` seconds they raise `WaitTimeout` naming what was awaited
(and the last exception ``condition`` raised, for those listed in ``ignore``: they mean "not yet").
The tests use these through `tests/support/wait.py`; the `folio up` driver and the demo directly.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError, TimeoutError):
    """What was awaited did not happen in time: a failed test in pytest, a TimeoutError elsewhere."""


def _timed_out(what: str, timeout: float, last: BaseException | None) -> WaitTimeout:
    detail = f"; last error: {last!r}" if last is not None else ""
    return WaitTimeout(f"{what} was not reached within {timeout:g}s{detail}")


def wait_for(condition: Callable[[], T], timeout: float = 10.0, what: str = "the condition",
             interval: float = 0.01, *, ignore: tuple[type[BaseException], ...] = ()) -> T:  # fmt: skip
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = condition()
            if result:
                return result
        except ignore as exc:
            last = exc
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, last)
        time.sleep(interval)


async def until(condition: Callable[[], T | Awaitable[T]], timeout: float = 10.0, what: str = "the condition",
                interval: float = 0.02, tick: Callable[[], Awaitable[object]] | None = None, *,
                ignore: tuple[type[BaseException], ...] = ()) -> T:  # fmt: skip
    """``condition`` may be a coroutine function; ``tick``, when given, is awaited before each look
    (e.g. a supervisor's ``tick``)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        if tick is not None:
            await tick()
        try:
            result = condition()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return result  # type: ignore[return-value]
        except ignore as exc:
            last = exc
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, last)
        await asyncio.sleep(interval)
