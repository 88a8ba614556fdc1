"""Multi-LoRA in the decoder layers: each step's per-token adapter slots, and the stacked adapter buffers
the four projections add their deltas from (`folio.kernels.lora`'s batched shrink-expand).

With LoRA off the layers hold no stacks and the context has no `LoRAContext`: nothing runs, nothing is
checked. With LoRA on, an eager step with no adapter token has none either.

Decode graphs (`folio.engine.cpu_graphs`, `folio.engine.cuda_graphs`) replay one pass whatever the mix of
adapters, so their context reads the slots from a static buffer: on CUDA the Triton kernel reads them per
token; elsewhere each token gathers its slot's pair (-1 maps to the stacks' last slot, kept zero) and two
batched products add the delta, a fixed handful of ops with no host-side grouping.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from folio.kernels.lora import LoRAGroups, add_lora, lora_groups

# (a [S, R, in], b [S, out, R]): one projection's adapters, one per device slot
Pair = tuple[torch.Tensor, torch.Tensor]


@dataclass
class LoRAContext:
    """A step's adapter slot per token (-1: the base model), grouped once for every layer."""

    slots: torch.Tensor  # [T] int32, the step's token order (prefills, then decodes)
    groups: LoRAGroups | None
    # the same for the rows that leave the last layer (`DecoderLM.forward`'s ``rows``), when it has them
    rows: LoRAContext | None = None
    # graph passes off CUDA: each token's slot with -1 mapped to the zero slot, int64 (see the module doc)
    index: torch.Tensor | None = None

    @classmethod
    def build(cls, slots: list[int], device: torch.device) -> LoRAContext:
        t = torch.tensor(slots, dtype=torch.int32, device=device)
        return cls(t, lora_groups(t))

    @classmethod
    def for_graph(cls, slots: torch.Tensor, zero_slot: int) -> LoRAContext:
        """A graph pass's context over the static ``slots`` buffer; ``zero_slot``: the stacks' zero slot."""
        if slots.device.type == "cuda":
            return cls(slots, lora_groups(slots))  # no grouping on CUDA: the kernel reads slots per token
        return cls(slots, None, index=torch.where(slots < 0, zero_slot, slots).long())

    def select(self, rows: torch.Tensor | None) -> LoRAContext:
        """The context of the layer's output rows: all of them, or the last layer's ``rows``."""
        if rows is None:
            return self
        assert self.rows is not None, "the runner builds the rows' slots with the rows"
        return self.rows


def add_delta(out: torch.Tensor, x: torch.Tensor, pair: Pair | None, lora: LoRAContext | None) -> torch.Tensor:
    """``out`` plus each token's adapter delta (in place), where the layer has stacks and the step adapters."""
    if pair is None or lora is None:
        return out
    if lora.index is not None:
        return _add_gathered(out, x, pair, lora.index)
    return add_lora(out, x, pair[0], pair[1], lora.slots, groups=lora.groups)


def _add_gathered(out: torch.Tensor, x: torch.Tensor, pair: Pair, index: torch.Tensor) -> torch.Tensor:
    """``out[t] += b[i] @ (a[i] @ x[t])`` with ``i = index[t]``, in float32 as the batched op: fixed shapes,
    so a recorded pass replays it for any slots (decode batch sizes: the gathered pairs stay small)."""
    f32 = torch.float32
    shrink = torch.bmm(pair[0].index_select(0, index).to(f32), x.to(f32).unsqueeze(2))  # [T, R, 1]
    delta = torch.bmm(pair[1].index_select(0, index).to(f32), shrink).squeeze(2)  # [T, out]
    if out.dtype == f32:
        return out.add_(delta)
    return out.copy_(out.float().add_(delta))


def attach_lora(model: nn.Module, stacks: dict[tuple[int, str], Pair]) -> None:
    """Hand each decoder layer's attention and MLP blocks their stacks (`LoRALayout.allocate`'s); a block
    without an entry (a sparse MoE block) gets none and runs as before."""
    for (layer, proj), pair in stacks.items():
        block = model.layers[layer].self_attn if proj in ("qkv", "o") else model.layers[layer].mlp
        block.lora[proj] = pair
