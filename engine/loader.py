"""Weight loading: a Hugging Face style folder (safetensors, sharded or not) or a single `.gguf` file.

A pinned digest is checked before anything is read into memory, so mismatching weights never serve.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from folio.engine.config import ModelConfig
from folio.engine.digest import verify_digest
from folio.engine.distributed.sharding import ParamShard, TensorParallel, shard_model
from folio.engine.layers.weights import Index, deferred_params
from folio.engine.models.base import DecoderLM
from folio.engine.models.registry import architecture_of, gguf_family, model_class

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_gguf(path: str | Path) -> bool:
    p = Path(path)
    return p.is_file() and p.suffix == ".gguf"


def load_model_config(path: str | Path) -> tuple[ModelConfig, str | None]:
    """The model's architecture facts and the dtype its files declare (None when they do not say).
    An unsupported architecture fails here, naming the supported ones."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"model not found: {p}")
    if is_gguf(p):
        raw = _gguf_config(p)
        return ModelConfig.from_hf(raw, architecture_of(raw)), None
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise ValueError(f"{p} is neither a .gguf file nor a folder with a config.json")
    raw = json.loads(cfg_file.read_text())
    cfg = ModelConfig.from_hf(raw, architecture_of(raw))
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


@dataclass
class LoadStats:
    """What loading read: the checkpoint bytes copied into parameters (a tensor-parallel rank reads only
    its shards' bytes)."""

    bytes_read: int = 0
    shards: dict[str, ParamShard] = field(default_factory=dict)  # what each sharded parameter holds


def load_model(
    path: str | Path,
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_position: int,
    digest: str | None = None,
    tp: TensorParallel | None = None,
    layers: range | None = None,
) -> DecoderLM:
    """The model with its weights; with ``tp``, this rank's shard of it (`folio.engine.distributed`); with
    ``layers``, a pipeline stage's part (those decoder layers, and the embeddings, head and norm it holds)."""
    p = Path(path)
    if digest is not None:
        verify_digest(p, digest)
        log.info("weights match digest %s", digest)
    cls = model_class(cfg.architecture)
    with torch.device(device), deferred_params() if tp is not None else contextlib.nullcontext():
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = cls(cfg, max_position, layers)
        finally:
            torch.set_default_dtype(default)
    targets = model.checkpoint_targets()  # full-model layout, before sharding shrinks the blocks
    shards = {} if tp is None else shard_model(model, tp, device)
    tensors = _gguf_tensors(p, model) if is_gguf(p) else _safetensors(p)
    model.load_stats = LoadStats(_fill(model, tensors, targets, shards), shards)
    model.finish_loading()
    total, active = model.parameter_counts()
    where = "" if tp is None else f" on tensor-parallel rank {tp.rank} of {tp.size}"
    if layers is not None and len(layers) != cfg.num_hidden_layers:
        where += f" (layers {layers.start}-{layers.stop - 1})"
    if active != total:
        log.info("%s: %.1fM parameters%s, %.1fM active per token", cfg.architecture, total / 1e6, where, active / 1e6)
    else:
        log.info("%s: %.1fM parameters%s", cfg.architecture, total / 1e6, where)
    return model.eval()


class TensorSource(Protocol):
    """A checkpoint tensor not yet read: its shape, and reading all of it or a slice."""

    def get_shape(self) -> list[int]: ...
    def __getitem__(self, index: Any) -> torch.Tensor: ...


def _fill(
    model: DecoderLM,
    tensors: Iterator[tuple[str, TensorSource]],
    targets: dict[str, tuple[str, Index]],
    shards: dict[str, ParamShard],
) -> int:
    """Copy each checkpoint tensor into its part of a parameter (only this rank's pieces of a sharded
    one); every parameter must end up whole. Returns the bytes read."""
    params = dict(model.named_parameters())
    filled: dict[str, int] = {}
    read = 0
    for name, source in tensors:
        target = targets.get(name)
        if target is None:
            continue  # e.g. a tied lm_head, rotary caches
        pname, index = target
        if pname not in params:
            raise ValueError(f"checkpoint tensor {name} has no place in {model.config.architecture} with this config")
        shard = shards.get(pname)
        full = params[pname].data if shard is None else torch.empty(shard.full_shape, device="meta")
        expected = tuple((full[index] if index else full).shape)
        if tuple(source.get_shape()) != expected:
            raise ValueError(f"checkpoint tensor {name} has shape {tuple(source.get_shape())}, expected {expected}")
        pieces = [((), index)] if shard is None else shard.pieces(index)
        for src, dst in pieces:
            tensor = source[src] if src else source[:]
            part = params[pname].data[dst] if dst else params[pname].data
            part.copy_(tensor)
            filled[pname] = filled.get(pname, 0) + tensor.numel()
            read += tensor.numel() * tensor.element_size()
    wrong = [n for n, p in params.items() if filled.get(n, 0) != p.numel()]
    if wrong:
        raise ValueError(
            f"checkpoint lacks (or repeats) weights for: {', '.join(wrong[:5])}{' …' if len(wrong) > 5 else ''}"
        )
    return read


# --- safetensors ------------------------------------------------------------------------------------


def _safetensors(folder: Path) -> Iterator[tuple[str, TensorSource]]:
    """Each tensor as a lazy slice of the memory-mapped file: only what is indexed is read."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {folder}")
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                yield name, f.get_slice(name)


# --- GGUF ---------------------------------------------------------------------------------------------


def _gguf_config(path: Path) -> dict[str, Any]:
    """A config.json-style dict from the GGUF metadata, read by `transformers`' own GGUF mapping (so both
    agree on every default), plus what that mapping drops."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from folio.engine.gguf_reader import GGUFReader, in_transformers

    reader = GGUFReader(path)
    field = reader.fields.get("general.architecture")
    arch = field.contents() if field is not None else None
    gguf_family(str(arch))  # refuses unsupported architectures with the list of supported ones
    with in_transformers():
        raw = dict(load_gguf_checkpoint(str(path), return_tensors=False)["config"])
    # keys that transformers' mapping leaves to its config defaults for some architectures
    for key, name in (("attention.key_length", "head_dim"), ("expert_count", "num_experts"),
                      ("expert_used_count", "num_experts_per_tok"),
                      ("expert_feed_forward_length", "moe_intermediate_size")):
        field = reader.fields.get(f"{arch}.{key}")
        if field is not None:
            raw[name] = int(field.contents())
    return raw


def _gguf_tensors(path: Path, model: DecoderLM) -> Iterator[tuple[str, TensorSource]]:
    """GGUF tensors dequantised, renamed to the Hugging Face names and converted back where llama.cpp
    changed them (whole: a tensor-parallel rank then keeps its slices of them)."""
    from gguf import dequantize

    from folio.engine.gguf_reader import GGUFReader

    reader = GGUFReader(path)
    for t in reader.tensors:
        name = model.gguf_to_hf_name(t.name)
        if name is None:
            continue
        data = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
        yield name, _Loaded(model.gguf_tensor(t.name, data))


class _Loaded:
    """A tensor already in memory, as a `TensorSource`."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def get_shape(self) -> list[int]:
        return list(self.tensor.shape)

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self.tensor[index]
