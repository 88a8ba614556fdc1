"""The gated feed-forward block (SwiGLU, GeGLU): ``down(act(gate(x)) * up(x))``, gate and up merged."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from folio.engine.layers.linear import linear
from folio.engine.layers.lora import LayerLoRA, LoRAContext, add_delta
from folio.engine.layers.weights import CheckpointNames, empty_param
from folio.kernels import fused_cpu

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[name]


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, act: str = "silu") -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.act = activation(act)
        self.silu = act == "silu"  # the CPU has a native SiLU-and-multiply
        self.gate_up_weight = empty_param(2 * intermediate_size, hidden_size)
        self.down_weight = empty_param(hidden_size, intermediate_size)
        self.lora: dict[str, LayerLoRA] = {}  # "gate_up", "down" → adapter stacks, with LoRA on (`attach_lora`)

    def forward(self, x: torch.Tensor, lora: LoRAContext | None = None) -> torch.Tensor:
        gate_up = linear(x, self.gate_up_weight)
        if lora is not None:  # before the activation, as peft adapts gate_proj/up_proj
            add_delta(gate_up, x, self.lora.get("gate_up"), lora)
        if self.silu and gate_up.dim() == 2 and fused_cpu.supports(gate_up):
            h = fused_cpu.silu_and_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            h = self.act(gate).mul_(up)
        out = linear(h, self.down_weight)
        if lora is not None:
            add_delta(out, h, self.lora.get("down"), lora)
        return out

    def checkpoint_names(self) -> CheckpointNames:
        i = self.intermediate_size
        return {
            "gate_proj.weight": ("gate_up_weight", (slice(0, i),)),
            "up_proj.weight": ("gate_up_weight", (slice(i, 2 * i),)),
            "gate_up_proj.weight": ("gate_up_weight", ()),  # Phi-3 stores them fused, gate first
            "down_proj.weight": ("down_weight", ()),
        }
