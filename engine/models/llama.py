"""The Llama family (Llama, Mistral, Qwen2, SmolLM) as `transformers` configs describe it: RMSNorm, RoPE,
grouped-query attention, SwiGLU, tied or untied embeddings, optional q/k/v bias, and the sliding window
Mistral (every layer) and Qwen2 (the layers above max_window_layers) may set.

Q/K/V and gate/up projections are merged into one matrix each, so a layer makes four matmuls over all of
the step's tokens at once. Parameters are created empty; the loader fills them.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from folio.engine.layers.decoder_layer import PreNormDecoderLayer
from folio.engine.layers.mlp import GatedMLP
from folio.engine.layers.rotary import RotaryEmbedding
from folio.engine.layers.self_attention import SelfAttention
from folio.engine.models.base import DecoderLM


class LlamaForCausalLM(DecoderLM):
    ARCHITECTURES = ("LlamaForCausalLM",)
    MODEL_TYPES = ("llama",)
    GGUF_ARCHITECTURES = ("llama",)
    # llama.cpp stores Llama/Mistral Q and K rows permuted for its interleaved rope
    GGUF_ROPE_PERMUTED: ClassVar[bool] = True

    def make_shared(self) -> None:
        self.rotary = RotaryEmbedding.for_config(self.hf, self.config.head_dim, self.max_position)

    def attention_bias(self) -> bool:
        return bool(getattr(self.hf, "attention_bias", False))

    def make_attention(self, index: int) -> SelfAttention:
        cfg = self.config
        return SelfAttention(
            cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, self.rotary,
            window=self.layer_window(index), bias=self.attention_bias(),
        )

    def make_mlp(self, index: int) -> nn.Module:
        return GatedMLP(self.config.hidden_size, self.config.intermediate_size, getattr(self.hf, "hidden_act", "silu"))

    def make_layer(self, index: int) -> nn.Module:
        return PreNormDecoderLayer(
            self.config.hidden_size, self.config.rms_norm_eps, self.make_attention(index), self.make_mlp(index)
        )

    def gguf_tensor(self, gguf_name: str, tensor: torch.Tensor) -> torch.Tensor:
        if not self.GGUF_ROPE_PERMUTED:
            return tensor
        if ".attn_q." in gguf_name:
            return _unpermute(tensor, self.config.num_attention_heads)
        if ".attn_k." in gguf_name:
            return _unpermute(tensor, self.config.num_key_value_heads)
        return tensor


class MistralForCausalLM(LlamaForCausalLM):
    ARCHITECTURES = ("MistralForCausalLM",)
    MODEL_TYPES = ("mistral",)
    GGUF_ARCHITECTURES = ("mistral",)


class Qwen2ForCausalLM(LlamaForCausalLM):
    ARCHITECTURES = ("Qwen2ForCausalLM",)
    MODEL_TYPES = ("qwen2",)
    GGUF_ARCHITECTURES = ("qwen2",)
    GGUF_ROPE_PERMUTED = False

    def attention_bias(self) -> bool:
        return True  # Qwen2 always has q/k/v biases


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
