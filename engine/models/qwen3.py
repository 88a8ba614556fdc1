"""Qwen3: the Llama layout with an RMSNorm over each query and key head before the rotary embedding, an
explicit head_dim, and no q/k/v bias (unless attention_bias says so)."""

from __future__ import annotations

from folio.engine.layers.norm import RMSNorm
from folio.engine.layers.self_attention import SelfAttention
from folio.engine.models.base import LLAMA_GGUF_NAMES
from folio.engine.models.llama import LlamaForCausalLM

QK_NORM_GGUF_NAMES = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}


class Qwen3ForCausalLM(LlamaForCausalLM):
    ARCHITECTURES = ("Qwen3ForCausalLM",)
    MODEL_TYPES = ("qwen3",)
    GGUF_ARCHITECTURES = ("qwen3",)
    GGUF_LAYER_NAMES = LLAMA_GGUF_NAMES | QK_NORM_GGUF_NAMES
    GGUF_ROPE_PERMUTED = False

    def make_attention(self, index: int) -> SelfAttention:
        cfg = self.config
        return SelfAttention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, self.rotary,
            window=self.layer_window(index), bias=self.attention_bias(),
            qk_norm=lambda dim: RMSNorm(dim, cfg.rms_norm_eps),
        )
