"""Rotary position embeddings (neox style, as Llama in `transformers`), with linear and llama3 scaling."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from folio.kernels.rotary import apply_rotary_embedding

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def rope_type(rope_scaling: dict[str, Any] | None) -> str:
    if not rope_scaling:
        return "default"
    return rope_scaling.get("rope_type", rope_scaling.get("type", "default"))


def inv_frequencies(head_dim: int, base: float, rope_scaling: dict[str, Any] | None) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = rope_type(rope_scaling)
    if kind == "default":
        return inv_freq
    assert rope_scaling is not None
    factor = float(rope_scaling["factor"])
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        low, high = float(rope_scaling["low_freq_factor"]), float(rope_scaling["high_freq_factor"])
        old_len = float(rope_scaling["original_max_position_embeddings"])
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"rope_scaling type {kind!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})")


class RotaryEmbedding(nn.Module):
    use_kernels = False  # set by the model: folio.kernels (CUDA) instead of the PyTorch code below

    def __init__(
        self, head_dim: int, max_position: int, base: float, rope_scaling: dict[str, Any] | None
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_frequencies(head_dim, base, rope_scaling))
        # [max_position, head_dim]: first half cos, second half sin (the folio.kernels layout)
        self.register_buffer("cos_sin_cache", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [N, 1, D/2] for the positions; computed once per step, shared by all layers."""
        cos, sin = self.cos_sin_cache[positions].to(dtype).unsqueeze(1).chunk(2, dim=-1)
        return cos, sin

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [N, Hq, D] and k [N, Hkv, D] by their positions [N]."""
        if self.use_kernels:  # in place; strided views of the fused QKV output are fine
            apply_rotary_embedding(positions, q, k, self.cos_sin_cache)
            return q, k
        cos, sin = cos_sin if cos_sin is not None else self.cos_sin(positions, q.dtype)
        return rotate(q, cos, sin), rotate(k, cos, sin)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style rotation of x [N, H, D] (halves, not interleaved pairs), as `transformers` does."""
    x1, x2 = x.chunk(2, dim=-1)
    out = torch.empty_like(x)
    o1, o2 = out.chunk(2, dim=-1)
    tmp = torch.empty(x1.shape, dtype=x.dtype, device=x.device)
    # written into the halves of one output (no concatenation), with the same roundings as the expression
    # [x1*cos - x2*sin, x2*cos + x1*sin] (no fused multiply-add), which is what `transformers` computes
    torch.mul(x1, cos, out=o1).sub_(torch.mul(x2, sin, out=tmp))
    torch.mul(x2, cos, out=o2).add_(torch.mul(x1, sin, out=tmp))
    return out
