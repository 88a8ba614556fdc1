"""Backend choice: Triton for CUDA tensors; on the CPU the native C kernel where one exists and was built,
otherwise the PyTorch reference twin.

``backend="triton"`` on CPU tensors runs the Triton interpreter, which is how the kernels are tested
without a GPU. Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *defined*, so the
Triton modules are imported lazily (only when a Triton launch is requested) and the variable must be
set before that first import.
"""

from __future__ import annotations

from typing import Literal

import torch

Backend = Literal["auto", "triton", "native", "reference"]
BACKENDS = ("auto", "triton", "native", "reference")


def use_triton(backend: str, device: torch.device) -> bool:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    return backend == "triton" or (backend == "auto" and device.type == "cuda")


def use_native(backend: str, supported: bool, what: str) -> bool:
    """Whether to run a native CPU kernel that ``supported`` these inputs (auto: whenever it does)."""
    if backend == "native" and not supported:
        raise ValueError(f"the native CPU kernel cannot run {what} (it needs CPU tensors of a supported dtype "
                         "and a build with the C extension)")
    return backend == "native" or (backend == "auto" and supported)


def ensure_launchable(kernel: object, device: torch.device) -> None:
    """Refuses, with the fix in the message, to launch a compiled kernel on CPU tensors."""
    if device.type == "cuda":
        return
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(kernel, InterpretedFunction):
        raise ValueError(
            f"Triton kernels need CUDA tensors (got {device}); to run them on the CPU set TRITON_INTERPRET=1 "
            "before folio.kernels first launches a Triton kernel in this process"
        )
