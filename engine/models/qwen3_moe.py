"""Qwen3-MoE: Qwen3's attention (q/k norm) with a sparse mixture of experts on the layers the config makes
sparse (every decoder_sparse_step-th, none in mlp_only_layers; the others keep a dense MLP): top-k of the
router's softmax, renormalized when norm_topk_prob is set, weights rounded to the model dtype."""

from __future__ import annotations

from typing import ClassVar

from torch import nn

from folio.engine.layers.mlp import GatedMLP
from folio.engine.layers.moe import SparseMoE
from folio.engine.models.qwen3 import Qwen3ForCausalLM

MOE_GGUF_NAMES = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    ARCHITECTURES = ("Qwen3MoeForCausalLM",)
    MODEL_TYPES = ("qwen3_moe",)
    GGUF_ARCHITECTURES = ("qwen3moe",)
    GGUF_LAYER_NAMES = Qwen3ForCausalLM.GGUF_LAYER_NAMES | MOE_GGUF_NAMES
    supports_decode_graphs: ClassVar[bool] = False

    def make_mlp(self, index: int) -> nn.Module:
        hf = self.hf
        act = getattr(hf, "hidden_act", "silu")
        sparse = (
            index not in (hf.mlp_only_layers or [])
            and hf.num_experts > 0
            and (index + 1) % hf.decoder_sparse_step == 0
        )
        if not sparse:
            return GatedMLP(self.config.hidden_size, self.config.intermediate_size, act)
        return SparseMoE(
            self.config.hidden_size, hf.moe_intermediate_size, hf.num_experts, hf.num_experts_per_tok,
            normalize_top_k=bool(hf.norm_topk_prob), weights_in_float32=False, act=act,
        )
