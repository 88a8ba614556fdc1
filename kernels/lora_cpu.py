"""Batched multi-LoRA for the CPU's small steps (``kernels/csrc/lora_cpu.c``): ``out[t] += b[s] @ (a[s] @ x[t])``
with ``s = slots[t]`` in place, grouping the tokens by slot from the slots tensor's contents as it runs, so a
recorded CPU step graph replays it for any mix of adapters. Its PyTorch twin is
``folio.kernels.lora_reference.add_lora_ref``.

Built by ``pip install`` as an optional C extension; `AVAILABLE` says whether this install has it and this
CPU runs it (AVX2 or AVX-512F). ``b`` must be rank-major (`rank_major`), the layout the engine allocates its
CPU stacks in.
"""

from __future__ import annotations

import torch

from folio.kernels._checks import require
from folio.kernels.native import load_native

_cpu_lora = load_native("_cpu_lora")  # None without a C compiler: the PyTorch plans

AVAILABLE = _cpu_lora is not None and bool(_cpu_lora.available())
DTYPES = {torch.float32: 0, torch.bfloat16: 1}
MAX_BLOCKS = 8  # rank blocks of one projection (lora_cpu.c's MAX_BLOCKS)
Blocks = tuple[tuple[int, int], ...]  # each rank block's output rows, (start, stop)


def rank_major(b: torch.Tensor) -> bool:
    """Whether ``b [S, out, R]`` is laid out as ``[S][R][out]`` in memory, the kernel's layout."""
    _, n, r = b.shape
    return b.stride() == (r * n, 1, n) or b.numel() == 0


def zeros_rank_major(slots: int, out_features: int, rank: int, dtype: torch.dtype) -> torch.Tensor:
    """Zeroed ``b [slots, out_features, rank]`` stacks laid out rank-major."""
    return torch.zeros(slots, rank, out_features, dtype=dtype).transpose(1, 2)


def supports(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `add_lora_cpu` takes these operands: built and runnable here, CPU tensors of one supported
    dtype, ``a`` contiguous and ``b`` rank-major."""
    return (AVAILABLE and x.device.type == "cpu" and x.dtype in DTYPES and a.dtype == x.dtype
            and b.dtype == x.dtype and a.is_contiguous() and rank_major(b))


def add_lora_cpu(
    out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
    blocks: Blocks | None = None,
) -> torch.Tensor:
    """``out[t] += b[slots[t]] @ (a[slots[t]] @ x[t])`` in place; returns ``out``.

    ``x [T, in]`` and ``out [T, out]`` with unit last strides, ``a [S, R, in]`` contiguous, ``b [S, out, R]``
    rank-major, ``slots [T]`` int32 (-1: the base model; values outside ``[-1, S)`` add nothing).
    ``blocks``: the output rows ``(start, stop)`` of each of ``b``'s rank blocks (block ``j`` of ``n`` holds
    ranks ``j R / n`` to ``(j + 1) R / n``, and its columns of ``b`` are zero outside those rows, which
    are then skipped); None: one block over all rows.
    """
    assert _cpu_lora is not None, "folio.kernels._cpu_lora was not built"
    require(supports(x, a, b), lambda: f"lora_cpu takes CPU {'/'.join(str(d) for d in DTYPES)} operands of one "
            f"dtype, a contiguous and b rank-major; got x {x.dtype}, a {a.dtype} strides {a.stride()}, b {b.dtype} "
            f"strides {b.stride()}")
    tokens, in_features = x.shape
    num_slots, rank, _ = a.shape
    n = out.shape[1]
    require(x.stride(1) == 1 and out.stride(1) == 1 and out.dtype == x.dtype and out.shape[0] == tokens,
            lambda: f"x and out must be [T, features] rows of one dtype with unit last strides, got x "
                    f"{tuple(x.shape)} {x.stride()}, out {out.dtype} {tuple(out.shape)} {out.stride()}")
    require(a.shape[2] == in_features and tuple(b.shape) == (num_slots, n, rank),
            lambda: f"a {tuple(a.shape)} and b {tuple(b.shape)} do not fit x {tuple(x.shape)} and out {tuple(out.shape)}")
    require(slots.dtype == torch.int32 and slots.shape == (tokens,) and slots.is_contiguous(),
            lambda: f"slots must be contiguous int32 [{tokens}], got {slots.dtype} {tuple(slots.shape)}")
    blocks = ((0, n),) if blocks is None else blocks
    require(1 <= len(blocks) <= MAX_BLOCKS and rank % len(blocks) == 0
            and all(0 <= lo <= hi <= n for lo, hi in blocks),
            lambda: f"blocks must be 1-{MAX_BLOCKS} (start, stop) row ranges within [0, {n}) dividing rank "
                    f"{rank}, got {blocks}")
    if tokens and num_slots and rank and n:
        _cpu_lora.add(out.data_ptr(), x.data_ptr(), a.data_ptr(), b.data_ptr(), slots.data_ptr(), tokens,
                      in_features, n, num_slots, rank, x.stride(0), out.stride(0),
                      tuple(v for rows in blocks for v in rows), DTYPES[x.dtype], torch.get_num_threads())
    return out
