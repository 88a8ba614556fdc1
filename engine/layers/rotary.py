"""Rotary position embeddings (neox style), with the frequencies `transformers` computes for the config.

The inverse frequencies of every scaled rope type that does not change while a sequence grows (linear,
llama3, yarn, longrope) come from `transformers`' own rope functions, so they are the reference's numbers
bit for bit; `attention_scaling` (yarn, longrope) scales cos and sin as it does there. LongRoPE (Phi-3)
uses its long factors when ``max_model_len`` exceeds the trained context and its short factors otherwise,
for every token: `transformers` switches per forward pass when the sequence crosses that length, which
would leave the cached keys rotated by the other set (vLLM decides per engine, as here). A partial rotary
factor rotates the first ``rotary_dim`` dimensions of each head and leaves the rest.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from folio.kernels.rotary import apply_rotary_embedding

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def rope_parameters(hf_config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The rope parameters of a layer type (Gemma 3 keeps one set per type) or of the whole model."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    params.setdefault("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.pop("type", "default"))
    return params


def inv_frequencies(
    hf_config: Any, head_dim: int, max_model_len: int, layer_type: str | None = None
) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rotary_dim / 2] float32, attention scaling) for a layer type of the model."""
    params = rope_parameters(hf_config, layer_type)
    kind = params["rope_type"]
    if kind == "default":
        partial = float(params.get("partial_rotary_factor", getattr(hf_config, "partial_rotary_factor", 1.0)))
        dim = int(head_dim * partial)
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (float(params["rope_theta"]) ** exponents), 1.0
    if kind not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope type {kind!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)}); dynamic rope "
            "scaling changes the frequencies while a sequence grows, which a paged cache of rotated keys cannot follow"
        )
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kwargs: dict[str, Any] = {"layer_type": layer_type} if layer_type is not None else {}
    if kind == "longrope":
        kwargs["seq_len"] = max_model_len  # long factors iff a sequence may outgrow the trained context
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](hf_config, None, **kwargs)
    return inv_freq.float(), float(scaling)


class RotaryEmbedding(nn.Module):
    use_kernels = False  # set by the model: folio.kernels (CUDA) instead of the PyTorch code below

    def __init__(self, inv_freq: torch.Tensor, max_position: int, attention_scaling: float = 1.0) -> None:
        super().__init__()
        self.rotary_dim = 2 * inv_freq.shape[0]
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq.float())
        cos, sin = freqs.cos(), freqs.sin()
        if attention_scaling != 1.0:
            cos, sin = cos * attention_scaling, sin * attention_scaling
        # [max_position, rotary_dim]: first half cos, second half sin (the folio.kernels layout)
        self.register_buffer("cos_sin_cache", torch.cat([cos, sin], dim=-1), persistent=False)

    @classmethod
    def for_config(
        cls, hf_config: Any, head_dim: int, max_position: int, layer_type: str | None = None
    ) -> RotaryEmbedding:
        inv_freq, scaling = inv_frequencies(hf_config, head_dim, max_position, layer_type)
        return cls(inv_freq, max_position, scaling)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [N, 1, rotary_dim / 2] for the positions; computed once per step, shared by all layers."""
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
    """Neox-style rotation of x [N, H, D] (halves, not interleaved pairs), as `transformers` does; with
    cos/sin narrower than D/2 only the first 2 * cos.shape[-1] dimensions turn."""
    half = cos.shape[-1]
    out = torch.empty_like(x)
    if 2 * half < x.shape[-1]:  # partial rotary: the rest passes through
        out[..., 2 * half :] = x[..., 2 * half :]
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    o1, o2 = out[..., :half], out[..., half : 2 * half]
    tmp = torch.empty(x1.shape, dtype=x.dtype, device=x.device)
    # written into the halves of one output (no concatenation), with the same roundings as the expression
    # [x1*cos - x2*sin, x2*cos + x1*sin] (no fused multiply-add), which is what `transformers` computes
    torch.mul(x1, cos, out=o1).sub_(torch.mul(x2, sin, out=tmp))
    torch.mul(x2, cos, out=o2).add_(torch.mul(x1, sin, out=tmp))
    return out
