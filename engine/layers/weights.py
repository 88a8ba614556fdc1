"""How checkpoint tensors find their parameters.

Parameters are created empty and filled by the loader. A block that merges several checkpoint tensors
into one parameter (Q/K/V, gate/up, the experts of a mixture) says, in ``checkpoint_names()``, which part
of which parameter each of its checkpoint tensors fills: a checkpoint name relative to the block maps to
``(parameter name relative to the block, index)``, the index selecting rows (or an expert) of the
parameter's data. Blocks without the method are filled parameter by parameter under their own names.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

Index = tuple[int | slice, ...]
CheckpointNames = dict[str, tuple[str, Index]]


_deferred = False


@contextmanager
def deferred_params() -> Iterator[None]:
    """Make `empty_param` parameters on the meta device: a tensor-parallel rank then allocates only its
    shard of each (`folio.engine.distributed.sharding`), never the whole model on its device."""
    global _deferred
    before, _deferred = _deferred, True
    try:
        yield
    finally:
        _deferred = before


def empty_param(*shape: int) -> nn.Parameter:
    if _deferred:
        return nn.Parameter(torch.empty(*shape, device="meta"), requires_grad=False)
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


def checkpoint_targets(module: nn.Module, ours: str = "", theirs: str = "") -> dict[str, tuple[str, Index]]:
    """Every checkpoint name of ``module``'s tree (prefixed ``theirs``) → (our parameter name, index)."""
    targets: dict[str, tuple[str, Index]] = {}
    names = getattr(module, "checkpoint_names", None)
    claimed: set[str] = set()
    if names is not None:
        for ckpt, (param, index) in names().items():
            targets[theirs + ckpt] = (ours + param, index)
            claimed.add(param.split(".", 1)[0])
    else:
        for pname, _ in module.named_parameters(recurse=False):
            targets[theirs + pname] = (ours + pname, ())
    for child_name, child in module.named_children():
        if child_name in claimed:
            continue
        hf_name = getattr(module, "checkpoint_aliases", {}).get(child_name, child_name)
        targets |= checkpoint_targets(child, f"{ours}{child_name}.", f"{theirs}{hf_name}.")
    return targets


def finish_loading(module: nn.Module) -> None:
    """Let every block derive what it keeps from its filled weights (e.g. Gemma's 1 + norm weight)."""
    for m in module.modules():
        hook = getattr(m, "finish_loading", None)
        if hook is not None and m is not module:
            hook()
