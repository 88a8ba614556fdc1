"""Triton kernel of ``store_kvcache``: one program per token copies all of its KV heads."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from folio.kernels._backend import ensure_launchable


@triton.jit
def _store_kvcache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kn, stride_kh, stride_vn, stride_vh,
    KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:  # padding
        return
    heads = tl.arange(0, BLOCK_H)[:, None]
    dims = tl.arange(0, BLOCK_D)[None, :]
    mask = (heads < KV_HEADS) & (dims < HEAD_DIM)
    k = tl.load(key_ptr + token * stride_kn + heads * stride_kh + dims, mask=mask)
    v = tl.load(value_ptr + token * stride_vn + heads * stride_vh + dims, mask=mask)
    # The cache is contiguous: a slot is KV_HEADS * HEAD_DIM consecutive elements.
    dst = slot * (KV_HEADS * HEAD_DIM) + heads * HEAD_DIM + dims
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def store_kvcache_triton(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Launches the kernel on inputs already checked by ``folio.kernels.kv_store.store_kvcache``."""
    ensure_launchable(_store_kvcache_kernel, key.device)
    num_tokens, kv_heads, head_dim = key.shape
    _store_kvcache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        KV_HEADS=kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
    )
