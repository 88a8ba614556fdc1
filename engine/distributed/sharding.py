"""Megatron-style sharding of a model across tensor-parallel ranks.

Column-parallel: the merged Q/K/V projection (by heads) and gate/up (by intermediate rows); each rank
computes its heads' attention and its slice of the feed-forward block. Row-parallel: the output and
down projections take the matching input columns, and one all-reduce after each block sums the ranks'
partial outputs, so every rank holds the whole hidden state between blocks. KV heads are split like the
query heads they serve; with more ranks than KV heads each rank keeps the one KV head its query heads
use (replicated). Mixture-of-experts blocks shard every expert's MLP the same way (each rank holds a
slice of each expert) behind a replicated router, so every rank routes identically. The embedding table
and LM head are vocabulary-parallel: each rank holds a contiguous range of rows; lookups outside it give
zeros and the all-reduce fills them in; rank 0 gathers the logit columns of every rank.

A model to shard is built with its big parameters on the meta device (`deferred_params`); `shard_model`
allocates each rank's shard on the real device and returns, per parameter, which full-parameter rows or
columns the shard holds (`ParamShard`), which is what the loader reads from the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from folio.engine.config import ModelConfig
from folio.engine.layers.mlp import GatedMLP
from folio.engine.layers.moe import SparseMoE
from folio.engine.layers.self_attention import SelfAttention
from folio.engine.layers.weights import Index

if TYPE_CHECKING:
    from folio.engine.models.base import DecoderLM


class Collectives(Protocol):
    """What sharded layers need from the tensor-parallel group (`parallel_state.TensorParallelGroup`)."""

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor: ...
    def gather_to_first(self, tensor: torch.Tensor) -> list[torch.Tensor] | None: ...


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in the tensor-parallel group. ``group`` runs the collectives (None: loading
    only, as in the sharded-loading tests)."""

    rank: int
    size: int
    group: Collectives | None = None

    def __post_init__(self) -> None:
        assert 0 <= self.rank < self.size


# --- partitions ----------------------------------------------------------------------------------------


def even_split(total: int, tp: TensorParallel) -> tuple[int, int]:
    assert total % tp.size == 0, f"{total} does not split over {tp.size} ranks"
    per = total // tp.size
    return tp.rank * per, (tp.rank + 1) * per


def kv_heads(num_kv_heads: int, tp: TensorParallel) -> tuple[int, int]:
    """The KV heads [first, end) this rank holds: its share, or the one its query heads use when there
    are more ranks than KV heads (then replicated, N / num_kv_heads ranks each)."""
    if num_kv_heads >= tp.size:
        return even_split(num_kv_heads, tp)
    head = tp.rank // (tp.size // num_kv_heads)
    return head, head + 1


def vocab_rows(vocab_size: int, tp: TensorParallel) -> tuple[int, int]:
    """The vocabulary rows [first, end) this rank holds: ceil(V / N) each, the last rank fewer."""
    per = -(-vocab_size // tp.size)
    return min(vocab_size, tp.rank * per), min(vocab_size, (tp.rank + 1) * per)


def check_shardable(cfg: ModelConfig, size: int) -> None:
    """Refuse, before any process starts, a model whose heads or feed-forward sizes do not split over
    ``size`` ranks."""
    problems = []
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if heads % size:
        problems.append(f"num_attention_heads {heads} is not divisible by it")
    if kv % size and size % kv:
        problems.append(f"num_key_value_heads {kv} neither divides it nor is divisible by it")
    sizes = {"intermediate_size": cfg.intermediate_size}
    moe = getattr(cfg.hf, "moe_intermediate_size", None)
    if moe and getattr(cfg.hf, "num_experts", 0):
        sizes["moe_intermediate_size"] = moe
    for name, value in sizes.items():
        if value % size:
            problems.append(f"{name} {value} is not divisible by it")
    if cfg.vocab_size < size:
        problems.append(f"vocab_size {cfg.vocab_size} is smaller than it")
    if problems:
        raise ValueError(f"tensor_parallel_size {size} does not fit {cfg.architecture}: {'; '.join(problems)}")


def local_config(cfg: ModelConfig, tp: TensorParallel) -> ModelConfig:
    """The model facts as one rank sees them: its heads (which size its KV cache)."""
    first, end = kv_heads(cfg.num_key_value_heads, tp)
    return replace(cfg, num_attention_heads=cfg.num_attention_heads // tp.size, num_key_value_heads=end - first)


# --- which part of a parameter a rank holds ------------------------------------------------------------


@dataclass(frozen=True)
class ParamShard:
    """A rank's shard of a parameter: along ``dim``, the full-parameter ``ranges`` laid one after another."""

    full_shape: tuple[int, ...]
    dim: int
    ranges: tuple[tuple[int, int], ...]

    @property
    def local_shape(self) -> tuple[int, ...]:
        shape = list(self.full_shape)
        shape[self.dim] = sum(end - start for start, end in self.ranges)
        return tuple(shape)

    def pieces(self, index: Index) -> list[tuple[Index, Index]]:
        """For a checkpoint tensor that fills ``index`` of the full parameter: (what to read of the
        checkpoint tensor, where it goes in the local shard), one pair per held range it meets."""
        d = self.dim
        if d < len(index):
            along = index[d]
            assert isinstance(along, slice), "a sharded dimension is filled by slices"
            lo, hi, _ = along.indices(self.full_shape[d])
        else:
            lo, hi = 0, self.full_shape[d]
        ckpt_dim = d - sum(isinstance(i, int) for i in index[:d])  # integer indices drop their dimension
        leading = tuple(index[:d]) + (slice(None),) * max(0, d - len(index))
        out: list[tuple[Index, Index]] = []
        offset = 0  # where the held range starts in the local shard
        for start, end in self.ranges:
            first, last = max(start, lo), min(end, hi)
            if first < last:
                src = (slice(None),) * ckpt_dim + (slice(first - lo, last - lo),)
                dst = (*leading, slice(offset + first - start, offset + last - start), *index[d + 1 :])
                out.append((src, dst))
            offset += end - start
        return out


# --- the vocabulary-parallel embedding and LM head -----------------------------------------------------


class VocabParallel:
    """Rows [first, end) of the embedding table (and LM head) on this rank, ``per_rank`` rows at most."""

    def __init__(self, group: Collectives | None, vocab_size: int, tp: TensorParallel) -> None:
        self.group = group
        self.vocab_size = vocab_size
        self.first, self.end = vocab_rows(vocab_size, tp)
        self.per_rank = -(-vocab_size // tp.size)

    def embed(self, input_ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        assert self.group is not None
        local = input_ids - self.first
        inside = (local >= 0) & (local < self.end - self.first)
        x = F.embedding(torch.where(inside, local, 0), table)
        x.masked_fill_(~inside.unsqueeze(-1), 0)  # another rank's rows: exact zeros, so the sum is exact
        return self.group.all_reduce(x)

    def gather_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[T, vocab] on rank 0 (every rank's columns in order); this rank's own [T, rows] elsewhere."""
        assert self.group is not None
        pad = self.per_rank - logits.shape[-1]
        padded = F.pad(logits, (0, pad)) if pad else logits.contiguous()
        parts = self.group.gather_to_first(padded)
        return logits if parts is None else torch.cat(parts, dim=-1)[:, : self.vocab_size]


# --- sharding a built model ----------------------------------------------------------------------------


def shard_model(model: DecoderLM, tp: TensorParallel, device: torch.device) -> dict[str, ParamShard]:
    """Give every meta-device parameter of ``model`` its storage on ``device``: this rank's shard of the
    sharded ones (set up with their collectives), the whole of the rest. Returns the shards by name."""
    shards: dict[str, ParamShard] = {}
    group = tp.group

    def all_reduce_output(module: nn.Module) -> None:
        if group is not None:
            module.register_forward_hook(_all_reduce_hook(group))

    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if isinstance(module, SelfAttention):
            shards |= {prefix + k: v for k, v in _shard_attention(module, tp).items()}
            all_reduce_output(module)
        elif isinstance(module, GatedMLP):
            shards |= {prefix + k: v for k, v in _shard_mlp(module, tp).items()}
            all_reduce_output(module)
        elif isinstance(module, SparseMoE):
            shards |= {prefix + k: v for k, v in _shard_moe(module, tp).items()}
            all_reduce_output(module)
    rows = vocab_rows(model.config.vocab_size, tp)
    for pname in ("embed_tokens", "lm_head"):
        if getattr(model, pname) is not None:
            shards[pname] = ParamShard(tuple(getattr(model, pname).shape), 0, (rows,))
    model.vocab_parallel = VocabParallel(group, model.config.vocab_size, tp)

    params = dict(model.named_parameters())
    for pname, shard in shards.items():
        assert params[pname].is_meta, f"{pname} was allocated before sharding"
        # a row-parallel projection's ranks each add a partial sum that the all-reduce sums: a bias added
        # by each rank would count tp.size times
        row_parallel = pname.endswith("_weight") and shard.dim == len(shard.full_shape) - 1 and "embed" not in pname
        assert not (row_parallel and pname.removesuffix("weight") + "bias" in params), (
            f"{pname} is row-parallel and has a bias: tensor parallelism would add it {tp.size} times")
    for pname, param in params.items():
        if not param.is_meta:
            continue
        shape = shards[pname].local_shape if pname in shards else tuple(param.shape)
        owner, attr = _owner(model, pname)
        setattr(owner, attr, nn.Parameter(torch.empty(shape, dtype=param.dtype, device=device), requires_grad=False))
    return shards


def _all_reduce_hook(group: Collectives) -> Callable[[nn.Module, object, torch.Tensor], torch.Tensor]:
    def hook(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
        return group.all_reduce(output)

    return hook


def _shard_attention(m: SelfAttention, tp: TensorParallel) -> dict[str, ParamShard]:
    d = m.head_dim
    q0, q1 = even_split(m.num_heads, tp)
    k0, k1 = kv_heads(m.num_kv_heads, tp)
    q_size, kv_size = m.q_size, m.kv_size  # the full model's, which the checkpoint names are laid out by
    qkv_rows = ((q0 * d, q1 * d), (q_size + k0 * d, q_size + k1 * d), (q_size + kv_size + k0 * d, q_size + kv_size + k1 * d))
    shards = {
        "qkv_weight": ParamShard(tuple(m.qkv_weight.shape), 0, qkv_rows),
        "o_weight": ParamShard(tuple(m.o_weight.shape), 1, ((q0 * d, q1 * d),)),
    }
    if m.qkv_bias is not None:
        shards["qkv_bias"] = ParamShard(tuple(m.qkv_bias.shape), 0, qkv_rows)
    m.num_heads, m.num_kv_heads = q1 - q0, k1 - k0
    m.q_size, m.kv_size = m.num_heads * d, m.num_kv_heads * d
    return shards


def _shard_mlp(m: GatedMLP, tp: TensorParallel) -> dict[str, ParamShard]:
    i = m.intermediate_size
    a, b = even_split(i, tp)
    m.intermediate_size = b - a
    return {
        "gate_up_weight": ParamShard(tuple(m.gate_up_weight.shape), 0, ((a, b), (i + a, i + b))),
        "down_weight": ParamShard(tuple(m.down_weight.shape), 1, ((a, b),)),
    }


def _shard_moe(m: SparseMoE, tp: TensorParallel) -> dict[str, ParamShard]:
    i = m.intermediate_size
    a, b = even_split(i, tp)
    m.intermediate_size = b - a
    return {  # [E, 2I, H] and [E, H, I]: a slice of every expert; the router stays whole
        "gate_up_weight": ParamShard(tuple(m.gate_up_weight.shape), 1, ((a, b), (i + a, i + b))),
        "down_weight": ParamShard(tuple(m.down_weight.shape), 2, ((a, b),)),
    }


def _owner(model: nn.Module, pname: str) -> tuple[nn.Module, str]:
    path, _, attr = pname.rpartition(".")
    return (model.get_submodule(path) if path else model), attr
