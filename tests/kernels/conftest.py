"""Kernel tests run the Triton kernels on CUDA when there is a GPU and in Triton's interpreter otherwise.

Triton decides between compiling and interpreting when a ``@triton.jit`` function is defined, and
folio.kernels defines its kernels lazily (on the first Triton launch), so setting the variable here,
before any test in this folder runs, is enough even if torch or triton were imported earlier.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
