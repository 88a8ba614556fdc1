"""Triton neox rotary embedding, in place: one program per token rotates all its query and key heads."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from folio.kernels._backend import ensure_launchable


@triton.jit
def _rotate_heads(x_ptr, stride_h, cos, sin, HEADS: tl.constexpr, HALF: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    j = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < HEADS) & (j < HALF)
    first = x_ptr + h * stride_h + j
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(first, (x1 * cos - x2 * sin).to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(first + HALF, (x2 * cos + x1 * sin).to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, cache_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_cache,
    Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)[None, :]
    row = cache_ptr + pos * stride_cache
    cos = tl.load(row + j, mask=j < HALF, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)
    _rotate_heads(q_ptr + token * stride_qt, stride_qh, cos, sin, Q_HEADS, HALF, BLOCK_QH, BLOCK_HALF)
    _rotate_heads(k_ptr + token * stride_kt, stride_kh, cos, sin, K_HEADS, HALF, BLOCK_KH, BLOCK_HALF)


def apply_rotary_embedding_triton(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Launches on inputs checked by ``folio.kernels.rotary.apply_rotary_embedding``."""
    ensure_launchable(_rotary_kernel, q.device)
    half = cos_sin_cache.shape[1] // 2
    _rotary_kernel[(q.shape[0],)](
        positions, q, k, cos_sin_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        Q_HEADS=q.shape[1], K_HEADS=k.shape[1], HALF=half,
        BLOCK_QH=triton.next_power_of_2(q.shape[1]), BLOCK_KH=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half),
    )
