"""Polling with a deadline: tests wait for the state they need, never for a fixed duration.

`wait_for` (threads, subprocesses) and `until` (asyncio) call ``condition`` until it returns something
truthy, which they return; past ``timeout`` seconds they fail the test naming what was awaited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 10.0, what: str = "the condition",
             interval: float = 0.01) -> T:  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} was not reached within {timeout:g}s")
        time.sleep(interval)


async def until(condition: Callable[[], T], timeout: float = 10.0, what: str = "the condition",
                interval: float = 0.02, tick: Callable[[], Awaitable[object]] | None = None) -> T:  # fmt: skip
    """``tick``, when given, is awaited before each look (e.g. a supervisor's ``tick``)."""
    deadline = time.monotonic() + timeout
    while True:
        if tick is not None:
            await tick()
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} was not reached within {timeout:g}s")
        await asyncio.sleep(interval)
