"""Mixtral: the Mistral layout with a sparse mixture of experts as feed-forward block (`block_sparse_moe`):
top-k of the router's softmax, always renormalized, weights applied in float32 (experts w1 = gate,
w3 = up, w2 = down)."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from folio.engine.layers.decoder_layer import PreNormDecoderLayer
from folio.engine.layers.moe import SparseMoE
from folio.engine.models.llama import LlamaForCausalLM


class MixtralForCausalLM(LlamaForCausalLM):
    ARCHITECTURES = ("MixtralForCausalLM",)
    MODEL_TYPES = ("mixtral",)
    GGUF_ARCHITECTURES = ()  # llama.cpp files Mixtral under "llama"; transformers does not read those experts
    supports_decode_graphs: ClassVar[bool] = False

    def make_mlp(self, index: int) -> nn.Module:
        hf = self.hf
        return SparseMoE(
            self.config.hidden_size, self.config.intermediate_size, hf.num_local_experts, hf.num_experts_per_tok,
            normalize_top_k=True, weights_in_float32=True, act=getattr(hf, "hidden_act", "silu"),
            expert_names=("w1", "w3", "w2"),
        )

    def make_layer(self, index: int) -> nn.Module:
        return PreNormDecoderLayer(
            self.config.hidden_size, self.config.rms_norm_eps, self.make_attention(index), self.make_mlp(index),
            mlp_name="block_sparse_moe",
        )
