"""Kernel tests run the Triton kernels on CUDA when there is a GPU and in Triton's interpreter otherwise.

Triton decides between compiling and interpreting when a ``@triton.jit`` function is defined, and
folio.kernels defines its kernels lazily (on the first Triton launch), so setting the variable here,
before any test in this folder runs, is enough even if torch or triton were imported earlier.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def each_simd_width(module: object, *, portable: bool = False) -> object:
    """An autouse fixture for a test module: each of its tests runs once per vector width that the native
    kernel ``module`` (a C extension with ``simd``) runs on this CPU, widest first (512: AVX-512F, 256: AVX2;
    0: the portable path, with ``portable``), so that one machine checks every path it can run."""
    best = module.simd() if module is not None else 0  # type: ignore[attr-defined]
    widths = [w for w in (512, 256) if w <= best] + ([0] if portable else [])

    @pytest.fixture(autouse=True, params=widths or [None], ids=lambda w: f"simd{w}")
    def simd_width(request: pytest.FixtureRequest) -> Iterator[int | None]:
        if request.param is None:  # not built, or no vector path here: the module's own skip applies
            yield None
            return
        module.simd(request.param)  # type: ignore[attr-defined]
        try:
            yield request.param
        finally:
            module.simd(best)  # type: ignore[attr-defined]

    return simd_width
