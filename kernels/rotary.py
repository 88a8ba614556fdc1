"""Rotary position embedding (neox style): the cos/sin cache and its in-place application.

The cache is ``[max_position, rotary_dim]``: the first half of each row holds ``cos(pos * inv_freq)``,
the second half ``sin(pos * inv_freq)``. A query or key row ``x = [x1, x2]`` (halves of the first
``rotary_dim`` values) becomes ``[x1*cos - x2*sin, x2*cos + x1*sin]``; any dimensions past
``rotary_dim`` are left alone (partial rotary).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from folio.kernels._backend import Backend, use_triton
from folio.kernels._checks import FLOAT_DTYPES, check_tensor, require


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: Mapping[str, Any]) -> torch.Tensor:
    """Llama 3.1's frequency-dependent scaling, operation for operation as transformers computes it."""
    missing = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"} - set(scaling)
    require(not missing, lambda: f"llama3 rope_scaling needs {sorted(missing)}")
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    old_context_len = scaling["original_max_position_embeddings"]
    require(high_freq_factor != low_freq_factor, "llama3 rope_scaling needs high_freq_factor != low_freq_factor")

    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_inv_freq(head_dim: int, base: float, rope_scaling: Mapping[str, Any] | None = None,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` (float32) for the default, ``linear`` and ``llama3`` rope types."""
    require(head_dim > 0 and head_dim % 2 == 0, lambda: f"rotary head_dim must be a positive even number, got {head_dim}")
    require(base > 0, lambda: f"rope base (rope_theta) must be positive, got {base}")
    inv_freq = 1.0 / (
        base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(device=device, dtype=torch.float) / head_dim)
    )
    rope_type = "default"
    if rope_scaling:
        rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        require("factor" in rope_scaling, "linear rope_scaling needs a factor")  # type: ignore[operator]
        return inv_freq / rope_scaling["factor"]  # type: ignore[index]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling)  # type: ignore[arg-type]
    raise ValueError(f"unsupported rope_scaling type {rope_type!r} (supported: default, linear, llama3)")


def rope_cos_sin_cache(
    head_dim: int, max_position: int, base: float, rope_scaling: Mapping[str, Any] | None = None,
    device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``[max_position, head_dim]``: cos in the first half, sin in the second (computed in float32)."""
    require(max_position > 0, lambda: f"max_position must be positive, got {max_position}")
    inv_freq = rope_inv_freq(head_dim, base, rope_scaling, device)
    freqs = torch.arange(max_position, device=device, dtype=torch.int64).float()[:, None] * inv_freq[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


def apply_rotary_embedding_ref(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    half = cos_sin_cache.shape[1] // 2
    cos, sin = cos_sin_cache[positions.long()].float().unsqueeze(1).split(half, dim=-1)   # [N, 1, half]
    for x in (q, k):
        x1, x2 = x[..., :half].float(), x[..., half : 2 * half].float()
        x[..., : 2 * half] = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def apply_rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
    *, backend: Backend = "auto",
) -> None:
    """Rotates ``q[N, Hq, D]`` and ``k[N, Hkv, D]`` in place by the angles of ``positions[N]``.

    ``q`` and ``k`` may be strided views (e.g. of a fused QKV projection) with contiguous head rows.
    """
    cache = check_tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=FLOAT_DTYPES)
    device = cache.device
    q = check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES, device=device)
    k = check_tensor("k", k, ndim=3, dtypes=(q.dtype,), device=device)
    positions = check_tensor("positions", positions, ndim=1, dtypes=(torch.int64, torch.int32), device=device,
                             unit_last_stride=False)
    num_tokens, head_dim = q.shape[0], q.shape[2]
    require(k.shape[0] == num_tokens and positions.shape[0] == num_tokens,
            lambda: f"q ({num_tokens}), k ({k.shape[0]}) and positions ({positions.shape[0]}) must have one row per token")
    require(k.shape[2] == head_dim, lambda: f"q and k head_dim differ: {head_dim} vs {k.shape[2]}")
    rotary_dim = cache.shape[1]
    require(rotary_dim % 2 == 0 and 0 < rotary_dim <= head_dim,
            lambda: f"cos_sin_cache width ({rotary_dim}) must be even and at most head_dim ({head_dim})")
    if num_tokens == 0:
        return
    if device.type == "cpu":
        lo, hi = int(positions.min()), int(positions.max())
        require(lo >= 0 and hi < cache.shape[0],
                lambda: f"positions must lie in [0, {cache.shape[0]}) (the cache's max_position), got [{lo}, {hi}]")
    if use_triton(backend, device):
        from folio.kernels.rotary_triton import apply_rotary_embedding_triton

        apply_rotary_embedding_triton(positions, q, k, cache)
    else:
        apply_rotary_embedding_ref(positions, q, k, cache)
