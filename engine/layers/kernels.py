"""Lazy access to `folio.kernels`, imported only when a CUDA tensor needs it (Triton is GPU-only)."""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def kernels() -> ModuleType:
    import folio.kernels

    return folio.kernels
