"""Input validation shared by the kernel wrappers: every problem becomes a ValueError that names it."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from folio.kernels.layout import BLOCK_TABLE_DTYPE, CONTEXT_LENS_DTYPE, KV_CACHE_DTYPES

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def require(condition: bool, message: str | Callable[[], str]) -> None:
    """Raises ValueError(message) unless condition holds; a callable message is only formatted on failure
    (the wrappers run on every layer of every step, so the happy path must not build strings)."""
    if not condition:
        raise ValueError(message() if callable(message) else message)


def _dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int,
    dtypes: Iterable[torch.dtype] | None = None,
    device: torch.device | None = None,
    unit_last_stride: bool = True,
) -> torch.Tensor:
    """Checks the type, rank, dtype and device of one argument; returns it typed as a tensor."""
    require(isinstance(t, torch.Tensor), lambda: f"{name} must be a torch.Tensor, got {type(t).__name__}")
    assert isinstance(t, torch.Tensor)
    require(t.dim() == ndim, lambda: f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        require(t.dtype in dtypes, lambda: f"{name} must be {_dtype_names(dtypes)}, got {t.dtype}")
    if device is not None:
        require(t.device == device, lambda: f"{name} is on {t.device} but the other tensors are on {device}")
    if unit_last_stride and t.numel() > 0:
        # Kernels index rows by stride but read each row's last dimension as one contiguous run.
        require(t.stride(-1) == 1, lambda: f"{name} must be contiguous in its last dimension, got strides {t.stride()}")
    return t


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    require(tuple(t.shape) == expected, lambda: f"{name} must have shape {expected}, got {tuple(t.shape)}")


def check_kv_cache(k_cache: object, v_cache: object) -> tuple[int, int, int, int]:
    """Checks a layer's cache pair against the layout; returns (num_blocks, block_size, kv_heads, head_dim)."""
    k = check_tensor("k_cache", k_cache, ndim=4, dtypes=KV_CACHE_DTYPES)
    v = check_tensor("v_cache", v_cache, ndim=4, dtypes=KV_CACHE_DTYPES, device=k.device)
    require(k.shape == v.shape, lambda: f"k_cache {tuple(k.shape)} and v_cache {tuple(v.shape)} differ in shape")
    require(k.dtype == v.dtype, lambda: f"k_cache ({k.dtype}) and v_cache ({v.dtype}) differ in dtype")
    require(k.is_contiguous() and v.is_contiguous(),
            "k_cache and v_cache must be contiguous [num_blocks, block_size, num_kv_heads, head_dim]")
    num_blocks, block_size, kv_heads, head_dim = k.shape
    require(block_size > 0 and kv_heads > 0 and head_dim > 0, lambda: f"empty cache dimension in {tuple(k.shape)}")
    return num_blocks, block_size, kv_heads, head_dim


def check_gqa(num_heads: int, num_kv_heads: int) -> int:
    """The number of query heads sharing one KV head."""
    require(num_heads % num_kv_heads == 0,
            lambda: f"query heads ({num_heads}) must be a multiple of KV heads ({num_kv_heads})")
    return num_heads // num_kv_heads


def check_paged_metadata(
    block_tables: object, context_lens: object, batch: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Checks block tables ``[batch, max_blocks]`` int32 and context lengths ``[batch]`` int32."""
    tables = check_tensor("block_tables", block_tables, ndim=2, dtypes=(BLOCK_TABLE_DTYPE,), device=device)
    lens = check_tensor("context_lens", context_lens, ndim=1, dtypes=(CONTEXT_LENS_DTYPE,), device=device,
                        unit_last_stride=False)
    require(tables.shape[0] == batch, lambda: f"block_tables has {tables.shape[0]} rows for a batch of {batch}")
    require(lens.shape[0] == batch, lambda: f"context_lens has {lens.shape[0]} entries for a batch of {batch}")
    return tables, lens


def check_scale(scale: object) -> float:
    require(isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale > 0,
            lambda: f"scale must be a positive number, got {scale!r}")
    return float(scale)  # type: ignore[arg-type]


def check_window(window: object) -> int | None:
    """A sliding window is None (full attention) or a positive number of tokens."""
    require(window is None or (isinstance(window, int) and not isinstance(window, bool) and window >= 1),
            lambda: f"window must be None or a positive int (tokens), got {window!r}")
    return window  # type: ignore[return-value]
