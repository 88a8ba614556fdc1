"""Multi-LoRA under tensor parallelism: each rank holds its shard of every adapter, cut as the base weight is.

Column-parallel projections (qkv by heads, gate_up by intermediate rows) keep the whole ``a`` and the
rows of ``b`` their weight holds; row-parallel ones (o, down) keep the input columns of ``a`` their weight
holds and the whole ``b``. A row-parallel rank's delta is then a partial sum like its output (the shrink
sums over its columns only), added inside the block, so the block's all-reduce sums it with the rest.

Rank 0 decides which adapter sits in which slot (`LoRASlots`); each step's message carries the slots it
wrote since the last one (`slot_writes`), and every other rank loads those adapters from the same folders
into the same slots (`write_slot`) before running the step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from folio.engine.distributed.sharding import ParamShard
from folio.engine.lora.adapter import LoRAAdapter, LoRAWeights
from folio.engine.lora.layout import LoRALayout, zeroed_pair
from folio.engine.lora.request import LoRARequest
from folio.engine.lora.slots import LoRASlots, Shard, Stacks

# projection → its parameter in a decoder layer
_PARAMS = {"qkv": "self_attn.qkv_weight", "o": "self_attn.o_weight", "gate_up": "mlp.gate_up_weight",
           "down": "mlp.down_weight"}
# a slot write: (slot index, the adapter now in it)
SlotWrite = tuple[int, LoRARequest]


def _cut(t: torch.Tensor, dim: int, ranges: tuple[tuple[int, int], ...]) -> torch.Tensor:
    return torch.cat([t.narrow(dim, start, end - start) for start, end in ranges], dim=dim)


def lora_shard(shards: dict[str, ParamShard]) -> Shard:
    """The `LoRASlots` shard function of a rank whose parameters hold ``shards`` (`LoadStats.shards`)."""

    def shard(layer: int, proj: str, pair: LoRAWeights) -> LoRAWeights:
        s = shards[f"layers.{layer}.{_PARAMS[proj]}"]
        if s.dim == 0:  # column-parallel: this rank's output rows
            return LoRAWeights(pair.a, _cut(pair.b, 0, s.ranges).contiguous())
        assert s.dim == 1
        return LoRAWeights(_cut(pair.a, 1, s.ranges).contiguous(), pair.b)

    return shard


def local_stacks(
    layout: LoRALayout, shards: dict[str, ParamShard], slots: int, max_rank: int, dtype: torch.dtype,
    device: torch.device,
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """`LoRALayout.allocate`'s zeroed stacks, cut to this rank's shard of each projection."""
    stacks = {}
    for (layer, proj), shape in sorted(layout.shapes.items()):
        s = shards[f"layers.{layer}.{_PARAMS[proj]}"]
        held = sum(end - start for start, end in s.ranges)
        out_features = held if s.dim == 0 else shape.out_features
        in_features = held if s.dim == 1 else shape.in_features
        stacks[(layer, proj)] = zeroed_pair(slots, shape.n_slices * max_rank, in_features, out_features, dtype, device)
    return stacks


def local_blocks(layout: LoRALayout, shards: dict[str, ParamShard]) -> dict[tuple[int, str], tuple[tuple[int, int], ...]]:
    """`LoRALayout.blocks` in this rank's rows: a column-parallel shard holds its ranges one after another
    (ascending), so a block's rows stay one run there."""
    local = {}
    for key, blocks in layout.blocks.items():
        s = shards[f"layers.{key[0]}.{_PARAMS[key[1]]}"]
        if s.dim != 0:  # row-parallel: every output row
            local[key] = blocks
            continue
        starts = [0]
        for start, end in s.ranges:
            starts.append(starts[-1] + end - start)
        mine = []
        for lo, hi in blocks:
            pieces = [(at + max(lo, start) - start, at + min(hi, end) - start)
                      for at, (start, end) in zip(starts, s.ranges, strict=False) if max(lo, start) < min(hi, end)]
            mine.append((pieces[0][0], pieces[-1][1]) if pieces else (0, 0))
        local[key] = tuple(mine)
    return local


def write_slot(stacks: Stacks, index: int, adapter: LoRAAdapter, shard: Shard) -> None:
    """Copy this rank's shard of ``adapter`` into slot ``index`` of every stack (zeros where it adapts none)."""
    for (layer, proj), (a_stack, b_stack) in stacks.items():
        pair = adapter.get(layer, proj)
        if pair is None:
            a_stack[index].zero_()
            b_stack[index].zero_()
            continue
        pair = shard(layer, proj, pair)
        a_stack[index].copy_(pair.a)
        b_stack[index].copy_(pair.b)


class SlotTracker:
    """Rank 0's record of what the other ranks' slots hold: `writes` gives the slots changed since."""

    def __init__(self, slots: LoRASlots) -> None:
        self.slots = slots
        self._sent: list[LoRARequest | None] = [None] * slots.max_loras

    def writes(self) -> Sequence[SlotWrite]:
        out: list[SlotWrite] = []
        for index, slot in enumerate(self.slots.slots):
            if not slot.lora_int_id:
                continue  # a freed slot keeps its tensors: nothing to send until it is written again
            request = self.slots.by_id.get(slot.lora_int_id) or self.slots.removed[slot.lora_int_id]
            if self._sent[index] is not request:
                self._sent[index] = request
                out.append((index, request))
        return out
