"""Gemma 3 (text): sliding-window layers interleaved with global ones (layer_types; five local to one
global in the released models), each kind with its own rotary base, GeGLU feed-forward, RMSNorm with
the (1 + weight) form computed in float32 on q and k heads and around both blocks ("sandwich" norms),
embeddings scaled by sqrt(hidden_size) in the model dtype, and attention scaled by
query_pre_attn_scalar^-1/2 instead of head_dim^-1/2.
"""

from __future__ import annotations

import torch
from torch import nn

from folio.engine.layers.context import AttentionContext
from folio.engine.layers.mlp import GatedMLP
from folio.engine.layers.norm import GemmaRMSNorm
from folio.engine.layers.rotary import RotaryEmbedding
from folio.engine.layers.self_attention import SelfAttention
from folio.engine.models.base import LLAMA_GGUF_NAMES, DecoderLM
from folio.engine.models.qwen3 import QK_NORM_GGUF_NAMES

GEMMA3_GGUF_NAMES = LLAMA_GGUF_NAMES | QK_NORM_GGUF_NAMES | {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, hidden_size: int, eps: float, self_attn: SelfAttention, mlp: GatedMLP) -> None:
        super().__init__()
        self.input_layernorm = GemmaRMSNorm(hidden_size, eps)
        self.self_attn = self_attn
        self.post_attention_layernorm = GemmaRMSNorm(hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden_size, eps)
        self.mlp = mlp
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden_size, eps)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        ctx: AttentionContext,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` is the previous layer's feed-forward output still to be added (None on the first layer);
        ``rows``: only those rows leave the layer."""
        if residual is None:
            residual, h = x, self.input_layernorm(x)
        else:
            h, residual = self.input_layernorm(x, residual)
        h = self.post_attention_layernorm(self.self_attn(positions, h, kv_cache, ctx, rows))
        if rows is not None:
            residual = residual[rows]
        h, residual = self.pre_feedforward_layernorm(h, residual)
        h = self.mlp(h) if ctx.lora is None else self.mlp(h, ctx.lora.select(rows))
        return self.post_feedforward_layernorm(h), residual


class Gemma3ForCausalLM(DecoderLM):
    ARCHITECTURES = ("Gemma3ForCausalLM",)
    MODEL_TYPES = ("gemma3_text",)
    GGUF_ARCHITECTURES = ("gemma3",)
    GGUF_LAYER_NAMES = GEMMA3_GGUF_NAMES

    def make_shared(self) -> None:
        hf = self.hf
        if getattr(hf, "attn_logit_softcapping", None) is not None:
            raise ValueError("Gemma 3 configs with attn_logit_softcapping are not supported")
        if getattr(hf, "use_bidirectional_attention", False):
            raise ValueError("Gemma 3 with use_bidirectional_attention (an encoder) is not supported")
        head_dim, max_pos = self.config.head_dim, self.max_position
        self.rotary_global = RotaryEmbedding.for_config(hf, head_dim, max_pos, "full_attention")
        self.rotary_local = RotaryEmbedding.for_config(hf, head_dim, max_pos, "sliding_attention")
        self.register_buffer("embed_scale", torch.tensor(self.config.hidden_size**0.5, dtype=torch.float32),
                             persistent=False)

    def make_norm(self, size: int) -> nn.Module:
        return GemmaRMSNorm(size, self.config.rms_norm_eps)

    def make_layer(self, index: int) -> nn.Module:
        cfg, hf = self.config, self.hf
        window = self.layer_window(index)
        attn = SelfAttention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            self.rotary_global if window is None else self.rotary_local,
            scale=float(hf.query_pre_attn_scalar) ** -0.5, window=window,
            bias=bool(getattr(hf, "attention_bias", False)), qk_norm=lambda dim: GemmaRMSNorm(dim, cfg.rms_norm_eps),
        )
        mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, hf.hidden_activation)
        return Gemma3DecoderLayer(cfg.hidden_size, cfg.rms_norm_eps, attn, mlp)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.lookup_embeddings(input_ids)
        # the scale is rounded to the model dtype first, as `transformers` does (sqrt(640) → 25.25 in bf16)
        return x * self.embed_scale.to(x.dtype)

    def greedy_tokens(self, hidden: torch.Tensor) -> torch.Tensor | None:
        # a soft cap can merge the largest logits into ties that the raw logits' screen would not see
        if getattr(self.hf, "final_logit_softcapping", None) is not None:
            return None
        return super().greedy_tokens(hidden)

    def compute_logits(self, hidden: torch.Tensor, float32: bool = True) -> torch.Tensor:
        cap = getattr(self.hf, "final_logit_softcapping", None)
        if cap is None:
            return super().compute_logits(hidden, float32)
        logits = super().compute_logits(hidden)  # the cap runs in float32
        return torch.tanh(logits / cap) * cap

    def gguf_tensor(self, gguf_name: str, tensor: torch.Tensor) -> torch.Tensor:
        # llama.cpp stores Gemma's norms as 1 + weight; `transformers` takes 1 back off, and so do we
        return tensor - 1 if gguf_name.endswith("norm.weight") else tensor
