"""Phi-3: the Llama layout with fused checkpoint tensors (qkv_proj, gate_up_proj), LongRoPE scaling (its
short and long factors and attention scaling, see `folio.engine.layers.rotary`), an optional partial
rotary factor, and a sliding window over every layer where the config sets one."""

from __future__ import annotations

from folio.engine.models.base import LLAMA_GGUF_NAMES
from folio.engine.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    ARCHITECTURES = ("Phi3ForCausalLM",)
    MODEL_TYPES = ("phi3",)
    GGUF_ARCHITECTURES = ("phi3",)
    # llama.cpp keeps Phi-3's fused tensors: attn_qkv, and ffn_up holding gate then up
    GGUF_LAYER_NAMES = LLAMA_GGUF_NAMES | {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
    GGUF_ROPE_PERMUTED = False
