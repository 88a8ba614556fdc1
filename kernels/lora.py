"""Batched multi-LoRA (Punica / S-LoRA shrink-expand): many adapters in one step, one slot index per token.

``add_lora(out, x, a, b, slots)`` adds ``b[s] @ (a[s] @ x[t])`` to ``out[t]`` in place, ``s = slots[t]``, for
every token whose slot is not -1 (the base model's tokens are left untouched). ``a [S, R, in]`` and
``b [S, out, R]`` hold the ``S`` device slots' adapters, zero-padded to the rank ``R`` (fused projections
concatenate their slices' ranks) with the LoRA scaling folded into ``b``; a slot no token uses must still
hold finite values (the CPU's batched plan multiplies it by zero). The shrink accumulates in float32 and the
rank-``R`` intermediate stays float32. Slot values are not range-checked (that would need the device's
values on the host): the caller guarantees ``-1 <= slots[t] < S``.

CUDA tensors run the Triton kernels (``lora_triton.py``, CUDA-graph safe), others the PyTorch reference
(``lora_reference.py``: the engine's CPU path for prompts, its decode steps run ``lora_cpu.py``).
``lora_groups(slots)`` groups the step's tokens once for all layers; pass its result as ``groups=`` to
every layer's call. A CPU step that a step graph records, where ``lora_cpu`` is not built, takes
``lora_groups(slots, static=True)`` instead: a plan that reads the slots only as data, so the recording
replays right whatever mix the slots tensor holds later (at ``S`` times the LoRA flops).
"""

from __future__ import annotations

import torch

from folio.kernels._backend import Backend, use_triton
from folio.kernels._checks import FLOAT_DTYPES, check_tensor, require
from folio.kernels.lora_cpu import rank_major
from folio.kernels.lora_reference import LoRAGroups, add_lora_ref, lora_groups

__all__ = ["LoRAGroups", "add_lora", "lora_groups"]

SLOT_DTYPES = (torch.int32, torch.int64)


def add_lora(
    out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, *,
    groups: LoRAGroups | None = None, backend: Backend = "auto",
) -> torch.Tensor:
    """``out[t] += b[slots[t]] @ (a[slots[t]] @ x[t])`` in place for ``slots[t] != -1``; returns ``out``.

    ``x [T, in]``, ``out [T, out]``, ``a [S, R, in]``, ``b [S, out, R]`` (one float dtype, one device, each
    contiguous in its last dimension, except that a CPU ``b`` may be rank-major), ``slots [T]`` int32 or
    int64, contiguous.
    """
    x = check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES)
    dtype, device = x.dtype, x.device
    out = check_tensor("out", out, ndim=2, dtypes=(dtype,), device=device)
    a = check_tensor("a", a, ndim=3, dtypes=(dtype,), device=device)
    b = check_tensor("b", b, ndim=3, dtypes=(dtype,), device=device, unit_last_stride=False)
    # contiguous in its last dimension, or on the CPU rank-major (the engine's CPU stacks, `lora_cpu`'s layout)
    require(b.stride(-1) == 1 or (device.type == "cpu" and rank_major(b)),
            lambda: f"b must be contiguous in its last dimension (or rank-major on the CPU), got strides {b.stride()}")
    slots = check_tensor("slots", slots, ndim=1, dtypes=SLOT_DTYPES, device=device)
    tokens, in_features = x.shape
    num_slots, rank, _ = a.shape
    require(out.shape[0] == tokens, lambda: f"out has {out.shape[0]} rows for x's {tokens} tokens")
    require(slots.shape[0] == tokens, lambda: f"slots has {slots.shape[0]} entries for x's {tokens} tokens")
    require(a.shape[2] == in_features,
            lambda: f"a's last dimension ({a.shape[2]}) must equal x's in_features ({in_features})")
    require(tuple(b.shape) == (num_slots, out.shape[1], rank),
            lambda: f"b must have shape (slots, out_features, rank) = {(num_slots, out.shape[1], rank)} "
                    f"to match a {tuple(a.shape)} and out {tuple(out.shape)}, got {tuple(b.shape)}")
    if groups is not None:
        require(isinstance(groups, LoRAGroups), lambda: f"groups must come from lora_groups, got {type(groups).__name__}")
        require(groups.num_tokens == tokens,
                lambda: f"groups were built for {groups.num_tokens} tokens, this call has {tokens}")
    if tokens == 0 or num_slots == 0 or rank == 0 or out.shape[1] == 0:
        return out
    if use_triton(backend, device):
        from folio.kernels.lora_triton import add_lora_triton

        return add_lora_triton(out, x, a, b, slots)
    return add_lora_ref(out, x, a, b, slots, groups)
