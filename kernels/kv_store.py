"""``store_kvcache``: scatter the new tokens' keys and values into the paged cache by slot."""

from __future__ import annotations

import torch

from folio.kernels._backend import Backend, use_triton
from folio.kernels._checks import check_kv_cache, check_shape, check_tensor, require
from folio.kernels.layout import PAD_SLOT_ID, SLOT_MAPPING_DTYPES


def store_kvcache_ref(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Reference twin: one indexed assignment over every non-padding token."""
    keep = slot_mapping != PAD_SLOT_ID
    slots = slot_mapping[keep].long()
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value[keep]


def store_kvcache(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, *, backend: Backend = "auto",
) -> None:
    """Writes ``key[i]``/``value[i]`` (``[N, kv_heads, head_dim]``) to slot ``slot_mapping[i]``; -1 is skipped.

    ``key`` and ``value`` may be strided views (e.g. slices of a fused QKV projection) as long as each
    head's ``head_dim`` values are contiguous.
    """
    num_blocks, block_size, kv_heads, head_dim = check_kv_cache(k_cache, v_cache)
    device = k_cache.device
    key = check_tensor("key", key, ndim=3, dtypes=(k_cache.dtype,), device=device)
    value = check_tensor("value", value, ndim=3, dtypes=(k_cache.dtype,), device=device)
    check_shape("key", key, (key.shape[0], kv_heads, head_dim))
    check_shape("value", value, tuple(key.shape))
    slot_mapping = check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=SLOT_MAPPING_DTYPES,
                                device=device, unit_last_stride=False)
    check_shape("slot_mapping", slot_mapping, (key.shape[0],))
    if key.shape[0] == 0:
        return
    if device.type == "cpu":
        # Cheap on the CPU; on CUDA this check would cost a device sync on every layer.
        lo, hi = int(slot_mapping.min()), int(slot_mapping.max())
        require(lo >= PAD_SLOT_ID and hi < num_blocks * block_size,
                lambda: f"slot_mapping values must lie in [-1, {num_blocks * block_size}), got [{lo}, {hi}]")
    if use_triton(backend, device):
        from folio.kernels.kv_store_triton import store_kvcache_triton

        store_kvcache_triton(key, value, k_cache, v_cache, slot_mapping)
    else:
        store_kvcache_ref(key, value, k_cache, v_cache, slot_mapping)
