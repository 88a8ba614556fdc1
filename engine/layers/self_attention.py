"""A decoder layer's attention block: merged Q/K/V projection, optional per-head q/k norm, rotary
embedding, paged attention (sliding-window where the layer has one), output projection."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from folio.engine.layers.attention import paged_attention
from folio.engine.layers.context import AttentionContext
from folio.engine.layers.linear import linear
from folio.engine.layers.lora import LayerLoRA, add_delta
from folio.engine.layers.rotary import RotaryEmbedding, rotate
from folio.engine.layers.weights import CheckpointNames, empty_param
from folio.kernels import fused_cpu


class SelfAttention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        rotary: RotaryEmbedding,
        *,
        scale: float | None = None,
        window: int | None = None,
        bias: bool = False,
        qk_norm: Callable[[int], nn.Module] | None = None,  # makes a norm over head_dim (one for q, one for k)
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size = num_heads * head_dim
        self.kv_size = num_kv_heads * head_dim
        self.scale = head_dim**-0.5 if scale is None else scale
        self.window = window
        self.qkv_weight = empty_param(self.q_size + 2 * self.kv_size, hidden_size)
        self.qkv_bias = empty_param(self.q_size + 2 * self.kv_size) if bias else None
        self.o_weight = empty_param(hidden_size, self.q_size)
        self.q_norm = None if qk_norm is None else qk_norm(head_dim)
        self.k_norm = None if qk_norm is None else qk_norm(head_dim)
        self.rotary = rotary
        self.lora: dict[str, LayerLoRA] = {}  # "qkv", "o" → adapter stacks, with LoRA on (`attach_lora`)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        ctx: AttentionContext,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The attention block's output for every token, or with ``rows`` for those rows only (every token's
        K/V is still stored)."""
        lora = ctx.lora
        qkv = linear(x, self.qkv_weight, self.qkv_bias)
        if lora is not None:  # before the q/k norms and the rotary embedding, as peft adapts q_proj/k_proj
            add_delta(qkv, x, self.lora.get("qkv"), lora)
        q_end, k_end = self.q_size, self.q_size + self.kv_size
        v = qkv[:, k_end:].view(-1, self.num_kv_heads, self.head_dim)
        cos_sin = ctx.rope_cos_sin.get(self.rotary)
        if cos_sin is not None and self.q_norm is None:  # PyTorch path: rotate q and k heads in one pass
            qk = qkv[:, :k_end].view(-1, self.num_heads + self.num_kv_heads, self.head_dim)
            # natively in place (qkv is this layer's own), else into a new tensor
            qk = fused_cpu.rotate_(qk, *cos_sin) if fused_cpu.supports(qk) else rotate(qk, *cos_sin)
            q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        else:
            q = qkv[:, :q_end].view(-1, self.num_heads, self.head_dim)
            k = qkv[:, q_end:k_end].view(-1, self.num_kv_heads, self.head_dim)
            if self.q_norm is not None and self.k_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = self.rotary(positions, q, k, cos_sin)
        o = paged_attention(q, k, v, kv_cache[0], kv_cache[1], ctx, self.scale, self.window)
        if rows is not None:
            o = o[rows]
        o = o.reshape(-1, self.q_size)
        out = linear(o, self.o_weight)
        if lora is not None:
            add_delta(out, o, self.lora.get("o"), lora.select(rows))
        return out

    def checkpoint_names(self) -> CheckpointNames:
        """Checkpoint tensors (names relative to this block) and where they go: separate q/k/v projections
        or a fused one (Phi-3's qkv_proj)."""
        q, k = slice(0, self.q_size), slice(self.q_size, self.q_size + self.kv_size)
        v = slice(self.q_size + self.kv_size, None)
        names: CheckpointNames = {
            "q_proj.weight": ("qkv_weight", (q,)),
            "k_proj.weight": ("qkv_weight", (k,)),
            "v_proj.weight": ("qkv_weight", (v,)),
            "qkv_proj.weight": ("qkv_weight", ()),
            "o_proj.weight": ("o_weight", ()),
        }
        if self.qkv_bias is not None:
            names |= {
                "q_proj.bias": ("qkv_bias", (q,)),
                "k_proj.bias": ("qkv_bias", (k,)),
                "v_proj.bias": ("qkv_bias", (v,)),
                "qkv_proj.bias": ("qkv_bias", ()),
            }
        if self.q_norm is not None:
            names |= {"q_norm.weight": ("q_norm.weight", ()), "k_norm.weight": ("k_norm.weight", ())}
        return names
