"""Lets a CPU step graph (`folio.engine.cpu_graphs`) record the native CPU kernels' calls.

The native kernels take data pointers and sizes, not tensors, so PyTorch's dispatcher never sees them: each
kernel wrapper reaches its C extension through a `NativeModule`, which hands out the module's functions as
they are, except inside `recording()`, where each call is also appended to the recording's list as
``(function, arguments)``. Replaying those calls with the same arguments re-runs the kernels on the same
memory, without the wrappers' Python.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

NativeCall = tuple[Callable[..., Any], tuple[Any, ...]]


class NotReplayable(RuntimeError):
    """The recorded work cannot be replayed as recorded (its result would not follow its inputs)."""


_state = threading.local()  # .calls: the open recording's list on this thread, if any


class NativeModule:
    """A native kernel extension module whose calls `recording()` can capture."""

    __slots__ = ("_module",)

    def __init__(self, module: object) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._module, name)
        calls: list[NativeCall] | None = getattr(_state, "calls", None)
        if calls is None or not callable(fn):
            return fn

        def record(*args: Any) -> None:
            calls.append((fn, args))
            if fn(*args) is not None:  # a value the Python around it may act on: replay would freeze it
                raise NotReplayable(f"the native call {name}() returned a value")

        return record


def native(module: object | None) -> NativeModule | None:
    """``module`` (an imported C extension, or None where it was not built) behind a `NativeModule`."""
    return None if module is None else NativeModule(module)


@contextmanager
def recording(calls: list[NativeCall]) -> Iterator[list[NativeCall]]:
    """Appends every native kernel call made on this thread to ``calls`` while open."""
    assert getattr(_state, "calls", None) is None, "recordings do not nest"
    _state.calls = calls
    try:
        yield calls
    finally:
        _state.calls = None
