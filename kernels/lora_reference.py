"""Batched multi-LoRA in plain PyTorch: ``out[t] += b[s] @ (a[s] @ x[t])`` with ``s = slots[t]``.

The reference twin of ``lora_triton.py`` and ``lora_cpu.py``, and the engine's CPU path for prompts. Tokens
are grouped by slot once per step (``lora_groups``, shared by every layer); each call then runs one of two
plans (float32 throughout):

* per group: ``(x[rows] @ a[s].T) @ b[s].T`` added to ``out[rows]``, where ``rows`` is a slice when the
  group's tokens are one contiguous run (a prefill's sequence) and an index otherwise. Cost ~ the LoRA
  flops plus a few ops per group: best for prefill-sized steps with a few adapters.
* batched: the groups padded to one length ``M`` (the largest group's) and run as two batched GEMMs over
  the slots up to the highest in use (``a`` and ``b`` are read as views, never gathered): a fixed handful of
  ops whatever the mix, at the price of the padding rows. Best for decode steps, where each token is its
  own sequence and the groups are small and even.

``add_lora_ref`` picks the cheaper plan per call from the shapes and the step's groups (no data read).
Both plans shape their work by the step's mix on the host, so a recorded CPU step graph
(``folio.engine.cpu_graphs``) could not replay them for another mix; groups made with
``lora_groups(slots, static=True)`` select a third plan whose ops depend only on the shapes:

* dense: the shrink for all ``S`` slots in one GEMM (``a`` viewed as ``[S*R, in]``), each token's other
  slots' columns zeroed by a mask computed in the call from ``slots``' contents, then one GEMM against
  ``b`` laid out as ``[out, S*R]``. ``S`` times the flops, no host work: replays with any slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

Plan = Literal["auto", "batched", "groups", "dense"]

# The plans' cost model in multiply-adds, fitted on one core at SmolLM2's decode and prefill shapes (one
# multiply-add ~ 0.04 ns there): besides the products themselves (padding rows included), each group of the
# per-group plan costs SLICE_GROUP_OVERHEAD (a contiguous run) or INDEX_GROUP_OVERHEAD (a gather and a
# scatter) in per-op overhead; the batched plan BATCHED_OVERHEAD plus BATCH_ENTRY_OVERHEAD per slot it spans.
SLICE_GROUP_OVERHEAD = 350_000
INDEX_GROUP_OVERHEAD = 600_000
BATCHED_OVERHEAD = 750_000
BATCH_ENTRY_OVERHEAD = 130_000


@dataclass(eq=False)
class LoRAGroups:
    """A step's tokens grouped by slot, built once per step by ``lora_groups`` and shared by all layers.

    ``groups`` lists ``(slot, rows)`` for each slot in use (never -1), ``rows`` a ``slice`` for a contiguous
    run of tokens or an int64 index tensor; it is ``None`` for CUDA slots, whose Triton path reads
    ``slots`` per token and which must not synchronize with the host to group them, and for ``static``
    groups, which stand for whatever the slots tensor holds when each layer runs (the dense plan).
    """

    slots: torch.Tensor
    groups: tuple[tuple[int, slice | torch.Tensor], ...] | None
    static: bool = False
    # The batched plan's layout, made by the first layer that runs it and reused by the rest of the step.
    _padded: tuple[torch.Tensor, torch.Tensor | None] | None = field(default=None, repr=False)

    @property
    def num_tokens(self) -> int:
        return self.slots.shape[0]

    @property
    def num_slots(self) -> int:
        """The highest slot in use plus one (0 for a base-model-only step); CPU groups only."""
        assert self.groups is not None
        return self.groups[-1][0] + 1 if self.groups else 0

    @property
    def max_group(self) -> int:
        assert self.groups is not None
        return max((_length(rows) for _, rows in self.groups), default=0)

    def padded(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(index, pad)``: ``index [num_slots * M]`` int64, slot s's tokens in ``index[s*M : s*M + n_s]``
        and token 0 in the padding; ``pad [num_slots, M, 1]`` bool, True on padding (``None`` when none)."""
        if self._padded is None:
            assert self.groups is not None
            n, m = self.num_slots, self.max_group
            index = torch.zeros(n * m, dtype=torch.int64, device=self.slots.device)
            pad = torch.ones(n * m, dtype=torch.bool, device=self.slots.device)
            for s, rows in self.groups:
                length = _length(rows)
                if isinstance(rows, slice):
                    rows = torch.arange(rows.start, rows.stop, device=self.slots.device)
                index[s * m:s * m + length] = rows
                pad[s * m:s * m + length] = False
            no_pad = n * m == sum(_length(rows) for _, rows in self.groups)
            self._padded = (index, None if no_pad else pad.view(n, m, 1))
        return self._padded


def _length(rows: slice | torch.Tensor) -> int:
    return rows.stop - rows.start if isinstance(rows, slice) else rows.shape[0]


def lora_groups(slots: torch.Tensor, *, static: bool = False) -> LoRAGroups:
    """Groups a step's tokens by their slot (``-1``: the base model, left out). CUDA slots are not grouped:
    their Triton path reads each token's slot itself, and grouping would wait on the device. ``static``:
    read nothing now, and run the CPU's dense plan, which a recorded step graph replays with any slots."""
    slots = slots.reshape(-1)
    if static:
        return LoRAGroups(slots, None, static=True)
    return LoRAGroups(slots, _group(slots) if slots.device.type == "cpu" else None)


def _group(slots: torch.Tensor) -> tuple[tuple[int, slice | torch.Tensor], ...]:
    # A handful of vectorized ops whatever T, then a Python pass over the distinct slots only.
    s64 = slots.to(torch.int64)
    order = torch.argsort(s64, stable=True)  # the base model's tokens first, then slot by slot in token order
    present, sizes = torch.unique(s64, return_counts=True)
    run_slots = torch.unique_consecutive(s64)  # one entry per run of equal slots
    runs = torch.bincount(run_slots + 1).tolist() if present.numel() else []
    offsets = torch.cumsum(sizes, 0) - sizes
    firsts = order[offsets]  # each slot's first token
    groups: list[tuple[int, slice | torch.Tensor]] = []
    for s, size, offset, first in zip(present.tolist(), sizes.tolist(), offsets.tolist(), firsts.tolist(), strict=True):
        if s < 0:
            continue
        if runs[s + 1] == 1:  # one contiguous run (a prefill's sequence): a slice, no gather
            groups.append((s, slice(first, first + size)))
        else:  # scattered (decode): a view of the sort
            groups.append((s, order[offset:offset + size]))
    return tuple(groups)


def _add_rows(out: torch.Tensor, rows: slice | torch.Tensor, delta: torch.Tensor) -> None:
    """``out[rows] += delta`` (float32), rounded once to ``out``'s dtype."""
    if out.dtype == torch.float32:
        if isinstance(rows, slice):
            out[rows] += delta
        else:
            out.index_add_(0, rows, delta)
    else:
        out[rows] = (out[rows].float() + delta).to(out.dtype)


def choose_plan(groups: LoRAGroups, rank: int, in_features: int, out_features: int) -> Plan:
    """The cheaper plan for a step's CPU groups (at least one) by the cost model above."""
    assert groups.groups
    per_row = rank * (in_features + out_features)
    rows = sum(_length(r) for _, r in groups.groups)
    group_cost = rows * per_row + sum(
        SLICE_GROUP_OVERHEAD if isinstance(r, slice) else INDEX_GROUP_OVERHEAD for _, r in groups.groups)
    batched_rows = groups.num_slots * groups.max_group
    batched_cost = BATCHED_OVERHEAD + groups.num_slots * BATCH_ENTRY_OVERHEAD + batched_rows * per_row
    return "batched" if batched_cost < group_cost else "groups"


def add_lora_ref(
    out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
    groups: LoRAGroups | None = None, plan: Plan = "auto",
) -> torch.Tensor:
    """``out[t] += b[slots[t]] @ (a[slots[t]] @ x[t])`` in place (``slots[t] == -1``: untouched); returns ``out``.

    ``x [T, in]``, ``out [T, out]``, ``a [S, R, in]``, ``b [S, out, R]``, one dtype; float32 throughout.
    ``plan`` forces a plan (tests); ``auto`` runs the dense one for ``static`` groups and otherwise picks
    the cheaper of the other two by the cost model above.
    """
    (tokens, in_features), (out_features, rank) = x.shape, b.shape[1:]
    f32 = torch.float32
    if plan == "dense" or (plan == "auto" and groups is not None and groups.static):
        num_slots = a.shape[0]
        ids = torch.arange(num_slots, device=slots.device)
        shrink = (x.to(f32) @ a.reshape(num_slots * rank, in_features).to(f32).T).view(tokens, num_slots, rank)
        # where, not a product: another slot's columns must add exactly nothing, even an inf
        shrink = torch.where((slots[:, None] == ids[None, :])[:, :, None], shrink, 0.0)
        b_flat = b.to(f32).permute(1, 0, 2).reshape(out_features, num_slots * rank)
        _add_rows(out, slice(None), shrink.view(tokens, num_slots * rank) @ b_flat.T)
        return out
    if groups is None or groups.groups is None:  # CUDA slots: grouping them here waits on the device
        groups = LoRAGroups(slots, _group(slots))
    if not groups.groups:
        return out
    if plan == "auto":
        plan = choose_plan(groups, rank, in_features, out_features)
    if plan == "batched":
        index, pad = groups.padded()
        n = groups.num_slots
        shrink = torch.bmm(x.index_select(0, index).to(f32).view(n, -1, in_features), a[:n].to(f32).transpose(1, 2))
        if pad is not None:
            # where, not a product: padding rows (copies of token 0) must add exactly nothing.
            shrink = torch.where(pad, 0.0, shrink)
        delta = torch.bmm(shrink, b[:n].to(f32).transpose(1, 2)).view(-1, out_features)
        if out.dtype == torch.float32:
            out.index_add_(0, index, delta)  # accumulates, so the padding's zeros on token 0 are harmless
        else:  # one rounding per element: sum in float32 first (an index assignment would let padding win)
            _add_rows(out, slice(None), torch.zeros(tokens, out_features, device=out.device).index_add_(0, index, delta))
        return out
    for s, rows in groups.groups:
        _add_rows(out, rows, (x[rows].to(f32) @ a[s].to(f32).T) @ b[s].to(f32).T)
    return out
