"""Write a tiny safetensors model as a GGUF file the way llama.cpp's converter would (float32 tensors,
llama.cpp's names and metadata keys), so that GGUF loading is tested against `transformers` reading the
same file."""

from __future__ import annotations

import json
from pathlib import Path

# family (llama.cpp architecture) → how its HF layer tensor names map to llama.cpp's
_COMMON = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}
LAYER_NAMES = {
    "qwen3": _COMMON,
    "phi3": _COMMON | {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
    "gemma3": _COMMON | {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                         "post_feedforward_layernorm": "post_ffw_norm"},
    "qwen3moe": _COMMON | {"mlp.gate": "ffn_gate_inp"},
}


def write_gguf(model_dir: Path, out: Path, arch: str) -> Path:
    import numpy as np
    import torch
    from gguf import GGUFWriter
    from safetensors.torch import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        tensors |= load_file(file)
    writer = GGUFWriter(str(out), arch)
    heads = cfg["num_attention_heads"]
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}
    rope = rope.get("full_attention", rope)
    writer.add_rope_freq_base(float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))))
    writer.add_vocab_size(cfg["vocab_size"])
    writer.add_bos_token_id(cfg["bos_token_id"])
    writer.add_eos_token_id(cfg["eos_token_id"])
    writer.add_pad_token_id(cfg["pad_token_id"])
    if cfg.get("sliding_window"):
        writer.add_sliding_window(cfg["sliding_window"])
    if "num_experts" in cfg:
        writer.add_expert_count(cfg["num_experts"])
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    names = LAYER_NAMES[arch]
    experts: dict[tuple[str, str], list[tuple[int, torch.Tensor]]] = {}
    for name, t in tensors.items():
        t = t.float()
        if arch == "gemma3" and name.endswith("norm.weight"):
            t = t + 1  # llama.cpp stores Gemma's norm factors as 1 + weight
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        elif name == "lm_head.weight":
            if cfg.get("tie_word_embeddings"):
                continue
            gguf_name = "output.weight"
        else:
            _, _, i, rest = name.split(".", 3)
            if ".experts." in rest:  # mlp.experts.{e}.{gate,up,down}_proj.weight → stacked ffn_*_exps
                _, _, e, proj, _ = rest.split(".")
                experts.setdefault((i, proj), []).append((int(e), t))
                continue
            module, suffix = rest.rsplit(".", 1)
            gguf_name = f"blk.{i}.{names[module]}.{suffix}"
        writer.add_tensor(gguf_name, np.ascontiguousarray(t.numpy()))
    for (i, proj), parts in sorted(experts.items()):
        stacked = torch.stack([t for _, t in sorted(parts, key=lambda p: p[0])])
        writer.add_tensor(f"blk.{i}.ffn_{proj.removesuffix('_proj')}_exps.weight", np.ascontiguousarray(stacked.numpy()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
