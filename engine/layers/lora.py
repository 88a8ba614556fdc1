"""Multi-LoRA in the decoder layers: each step's per-token adapter slots, and the stacked adapter buffers
the four projections add their deltas from (`folio.kernels.lora`'s batched shrink-expand).

With LoRA off the layers hold no stacks and the context has no `LoRAContext`: nothing runs, nothing is
checked. With LoRA on, an eager step with no adapter token has none either.

On the CPU, steps of up to `NATIVE_MAX_TOKENS` tokens (decode) run the native kernel
(`folio.kernels.lora_cpu`), which groups the tokens by slot as it runs: a recorded step graph
(`folio.engine.cpu_graphs`) replays it for any mix of adapters. Larger steps (prefill) run the PyTorch
plans, whose GEMMs suit many tokens per adapter. Decode graphs read the slots from a static buffer: on
CUDA the Triton kernel reads them per token; on a CPU without the native kernel the dense plan, which
also replays for any mix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from folio.kernels import lora_cpu
from folio.kernels.lora import LoRAGroups, add_lora, lora_groups

# the most tokens a CPU step runs through the native kernel: decode batches, not prompts
NATIVE_MAX_TOKENS = 64


class LayerLoRA(NamedTuple):
    """One projection's adapters, one per device slot: ``a [S, R, in]``, ``b [S, out, R]``, and the output
    rows each of ``b``'s rank blocks adds to (`LoRALayout.blocks`)."""

    a: torch.Tensor
    b: torch.Tensor
    blocks: lora_cpu.Blocks


@dataclass
class LoRAContext:
    """A step's adapter slot per token (-1: the base model), grouped once for every layer."""

    slots: torch.Tensor  # [T] int32, the step's token order (prefills, then decodes)
    groups: LoRAGroups | None
    # the same for the rows that leave the last layer (`DecoderLM.forward`'s ``rows``), when it has them
    rows: LoRAContext | None = None

    @classmethod
    def build(cls, slots: list[int], device: torch.device) -> LoRAContext:
        t = torch.tensor(slots, dtype=torch.int32, device=device)
        return cls(t, lora_groups(t))

    @classmethod
    def for_graph(cls, slots: torch.Tensor) -> LoRAContext:
        """A graph pass's context over the static ``slots`` buffer: nothing read from it now."""
        if slots.device.type == "cuda":
            return cls(slots, lora_groups(slots))  # no grouping on CUDA: the kernel reads slots per token
        return cls(slots, lora_groups(slots, static=True))

    def select(self, rows: torch.Tensor | None) -> LoRAContext:
        """The context of the layer's output rows: all of them, or the last layer's ``rows``."""
        if rows is None:
            return self
        assert self.rows is not None, "the runner builds the rows' slots with the rows"
        return self.rows


def add_delta(out: torch.Tensor, x: torch.Tensor, stack: LayerLoRA | None, lora: LoRAContext | None) -> torch.Tensor:
    """``out`` plus each token's adapter delta (in place), where the layer has stacks and the step adapters."""
    if stack is None or lora is None:
        return out
    if (x.shape[0] <= NATIVE_MAX_TOKENS and x.stride(-1) == 1 and out.stride(-1) == 1
            and lora_cpu.supports(x, stack.a, stack.b)):
        return lora_cpu.add_lora_cpu(out, x, stack.a, stack.b, lora.slots, stack.blocks)
    return add_lora(out, x, stack.a, stack.b, lora.slots, groups=lora.groups)


def attach_lora(
    model: nn.Module, stacks: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]],
    blocks: dict[tuple[int, str], lora_cpu.Blocks],
) -> None:
    """Hand each decoder layer's attention and MLP blocks their stacks (`LoRALayout.allocate`'s) and their
    rank blocks' rows (`LoRALayout.blocks`); a block without an entry (a sparse MoE block) gets none and
    runs as before."""
    for (layer, proj), (a, b) in stacks.items():
        block = model.layers[layer].self_attn if proj in ("qkv", "o") else model.layers[layer].mlp
        block.lora[proj] = LayerLoRA(a, b, blocks[(layer, proj)])
