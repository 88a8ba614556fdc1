"""Weight loading: a Hugging Face style folder (safetensors, sharded or not) or a single `.gguf` file.

A pinned digest is checked before anything is read into memory, so mismatching weights never serve.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from folio.engine.config import ModelConfig
from folio.engine.digest import verify_digest
from folio.engine.models.llama import SUPPORTED_ARCHITECTURES, LlamaForCausalLM

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def is_gguf(path: str | Path) -> bool:
    p = Path(path)
    return p.is_file() and p.suffix == ".gguf"


def load_model_config(path: str | Path) -> tuple[ModelConfig, str | None]:
    """The model's architecture facts and the dtype its files declare (None when they do not say)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"model not found: {p}")
    if is_gguf(p):
        return _gguf_config(p), None
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"{p} is neither a .gguf file nor a folder with a config.json")
    raw = json.loads(cfg_file.read_text())
    cfg = ModelConfig.from_hf(raw)
    gen_file = p / "generation_config.json"
    if gen_file.is_file():  # generation_config's eos (often a list) wins, as in `transformers`
        eos = json.loads(gen_file.read_text()).get("eos_token_id")
        if eos is not None:
            cfg.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
    return cfg, raw.get("dtype") or raw.get("torch_dtype")


def resolve_dtype(requested: str, declared: str | None, device: torch.device) -> torch.dtype:
    if requested != "auto":
        return _DTYPES[requested]
    dtype = _DTYPES.get(declared or "", torch.float32 if device.type == "cpu" else torch.bfloat16)
    if device.type == "cpu" and dtype == torch.float16:
        dtype = torch.float32  # float16 matmuls are slow on most CPUs
    return dtype


def load_model(
    path: str | Path,
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_position: int,
    digest: str | None = None,
) -> LlamaForCausalLM:
    p = Path(path)
    if digest is not None:
        verify_digest(p, digest)
        log.info("weights match digest %s", digest)
    if cfg.architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"architecture {cfg.architecture!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    with torch.device(device):
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = LlamaForCausalLM(cfg, max_position)
        finally:
            torch.set_default_dtype(default)
    tensors = _gguf_tensors(p, cfg) if is_gguf(p) else _safetensors(p)
    _fill(model, cfg, tensors)
    return model.eval()


# --- name mapping -----------------------------------------------------------------------------------

_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def _target(name: str, cfg: ModelConfig) -> tuple[str, int] | None:
    """(parameter name, first row) that a checkpoint tensor fills; None for tensors we do not use."""
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    if name == "model.embed_tokens.weight":
        return "embed_tokens", 0
    if name == "model.norm.weight":
        return "norm.weight", 0
    if name == "lm_head.weight":
        return (None if cfg.tie_word_embeddings else ("lm_head", 0))
    m = _HF_LAYER.match(name)
    if m is None:
        return None
    i, rest = m.group(1), m.group(2)
    table = {
        "self_attn.q_proj.weight": ("self_attn.qkv_weight", 0),
        "self_attn.k_proj.weight": ("self_attn.qkv_weight", q),
        "self_attn.v_proj.weight": ("self_attn.qkv_weight", q + kv),
        "self_attn.q_proj.bias": ("self_attn.qkv_bias", 0),
        "self_attn.k_proj.bias": ("self_attn.qkv_bias", q),
        "self_attn.v_proj.bias": ("self_attn.qkv_bias", q + kv),
        "self_attn.o_proj.weight": ("self_attn.o_weight", 0),
        "mlp.gate_proj.weight": ("mlp.gate_up_weight", 0),
        "mlp.up_proj.weight": ("mlp.gate_up_weight", cfg.intermediate_size),
        "mlp.down_proj.weight": ("mlp.down_weight", 0),
        "input_layernorm.weight": ("input_layernorm.weight", 0),
        "post_attention_layernorm.weight": ("post_attention_layernorm.weight", 0),
    }
    if rest not in table:
        return None
    param, row = table[rest]
    return f"layers.{i}.{param}", row


def _fill(model: LlamaForCausalLM, cfg: ModelConfig, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
    params = dict(model.named_parameters())
    filled: dict[str, int] = {}
    for name, tensor in tensors:
        target = _target(name, cfg)
        if target is None:
            continue
        pname, row = target
        if pname not in params:
            raise ValueError(f"checkpoint tensor {name} has no place in {cfg.architecture} with this config")
        dest = params[pname].data
        part = dest if dest.dim() == 0 else dest[row : row + tensor.shape[0]]
        if part.shape != tensor.shape:
            raise ValueError(f"checkpoint tensor {name} has shape {tuple(tensor.shape)}, expected {tuple(part.shape)}")
        part.copy_(tensor)
        filled[pname] = filled.get(pname, 0) + tensor.shape[0]
    missing = [n for n, p in params.items() if filled.get(n, 0) != p.shape[0]]
    if missing:
        raise ValueError(f"checkpoint lacks weights for: {', '.join(missing[:5])}{' …' if len(missing) > 5 else ''}")


# --- safetensors ------------------------------------------------------------------------------------


def _safetensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {folder}")
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                yield name, f.get_tensor(name)


# --- GGUF ---------------------------------------------------------------------------------------------


def _gguf_field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _gguf_config(path: Path) -> ModelConfig:
    from gguf import GGUFReader

    reader = GGUFReader(path)
    arch = _gguf_field(reader, "general.architecture")
    if arch not in _GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported (supported: {', '.join(_GGUF_ARCHITECTURES)})")

    def meta(key: str, default: Any = None) -> Any:
        return _gguf_field(reader, f"{arch}.{key}", default)

    names = {t.name for t in reader.tensors}
    heads = meta("attention.head_count")
    hidden = meta("embedding_length")
    vocab = meta("vocab_size") or len(_gguf_field(reader, "tokenizer.ggml.tokens", []))
    eos = _gguf_field(reader, "tokenizer.ggml.eos_token_id")
    return ModelConfig(
        architecture=_GGUF_ARCHITECTURES[arch],
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=meta("feed_forward_length"),
        num_hidden_layers=meta("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=meta("attention.head_count_kv") or heads,
        head_dim=meta("attention.key_length") or hidden // heads,
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        rope_scaling=None,
        max_position_embeddings=meta("context_length", 2048),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        eos_token_ids=[] if eos is None else [int(eos)],
    )


_GGUF_LAYER = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def _gguf_tensors(path: Path, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """GGUF tensors dequantised and renamed to the Hugging Face names."""
    from gguf import GGUFReader, dequantize

    reader = GGUFReader(path)
    # llama.cpp stores Llama/Mistral Q and K rows permuted for its rope; undo that (as transformers does)
    unpermute = cfg.architecture in ("LlamaForCausalLM", "MistralForCausalLM")
    for t in reader.tensors:
        data = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
        name = t.name
        if name == "token_embd.weight":
            yield "model.embed_tokens.weight", data
        elif name == "output_norm.weight":
            yield "model.norm.weight", data
        elif name == "output.weight":
            yield "lm_head.weight", data
        elif name.startswith("blk."):
            _, i, kind, suffix = name.split(".", 3)
            if kind not in _GGUF_LAYER:
                continue
            if unpermute and kind == "attn_q":
                data = _unpermute(data, cfg.num_attention_heads)
            elif unpermute and kind == "attn_k":
                data = _unpermute(data, cfg.num_key_value_heads)
            yield f"model.layers.{i}.{_GGUF_LAYER[kind]}.{suffix}", data


def _unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
