"""Mixture of experts: a softmax router picks each token's top-k experts; the experts run batched.

Routing follows `transformers` exactly: softmax over the router logits in float32, top-k, optionally the
k weights renormalized to sum to 1 (Mixtral always, Qwen3-MoE with ``norm_topk_prob``), and the weights
applied to each expert's output either in float32 (Mixtral) or rounded to the model dtype first (Qwen).

Experts are computed by sorted dispatch: the step's (token, expert) pairs are sorted by expert, each
expert multiplies its contiguous run of gathered rows in one matmul per projection (a loop over experts,
never over tokens), and the results are scattered back. A token's k expert outputs are summed in
ascending expert order, starting from zero, which is the order (and so the rounding) of `transformers`'
per-expert ``index_add_``.
"""

from __future__ import annotations

import torch
from torch import nn

from folio.engine.layers.linear import linear
from folio.engine.layers.mlp import activation
from folio.engine.layers.weights import CheckpointNames, empty_param


class SparseMoE(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        *,
        normalize_top_k: bool,
        weights_in_float32: bool,
        act: str = "silu",
        expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok must be in [1, {num_experts}], got {top_k}")
        self.num_experts, self.top_k, self.intermediate_size = num_experts, top_k, intermediate_size
        self.normalize_top_k = normalize_top_k
        self.weights_in_float32 = weights_in_float32
        self.act = activation(act)
        self.expert_names = expert_names
        self.router_weight = empty_param(num_experts, hidden_size)
        self.gate_up_weight = empty_param(num_experts, 2 * intermediate_size, hidden_size)
        self.down_weight = empty_param(num_experts, hidden_size, intermediate_size)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(expert ids [T, k] ascending per token, their weights [T, k] float32)."""
        probs = torch.softmax(linear(x, self.router_weight), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize_top_k:
            weights /= weights.sum(dim=-1, keepdim=True)
        experts, order = experts.sort(dim=-1)
        return experts, weights.gather(-1, order)

    def forward(self, x: torch.Tensor, lora: object = None) -> torch.Tensor:
        """``lora``: ignored, experts get no LoRA (`LoRALayout` has no entry for them)."""
        num_tokens, hidden = x.shape
        experts, weights = self.route(x)
        if not self.weights_in_float32:
            weights = weights.to(x.dtype)
        flat = experts.flatten()
        order = flat.argsort(stable=True)  # pairs grouped by expert, in token order within each
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        rows = x[order // self.top_k]
        out = torch.empty_like(rows)
        start = 0
        for e, n in enumerate(counts):
            if n:
                gate, up = linear(rows[start : start + n], self.gate_up_weight[e]).chunk(2, dim=-1)
                out[start : start + n] = linear(self.act(gate).mul_(up), self.down_weight[e])
                start += n
        pair_out = torch.empty_like(out)
        pair_out[order] = (out * weights.flatten()[order, None]).to(x.dtype)
        pair_out = pair_out.view(num_tokens, self.top_k, hidden)
        total = pair_out[:, 0].clone()
        for j in range(1, self.top_k):  # k adds of [T, hidden]: the reference's summation order
            total += pair_out[:, j]
        return total

    def checkpoint_names(self) -> CheckpointNames:
        """Per-expert tensors (``experts.{e}.gate_proj.weight`` …, Mixtral's w1/w3/w2), the experts stacked
        (``experts.gate_proj.weight`` [E, I, H], as GGUF stores them) or fused as `transformers` 5 keeps them
        (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I])."""
        gate, up, down = self.expert_names
        i = self.intermediate_size
        names: CheckpointNames = {
            "gate.weight": ("router_weight", ()),
            "experts.gate_proj.weight": ("gate_up_weight", (slice(None), slice(0, i))),
            "experts.up_proj.weight": ("gate_up_weight", (slice(None), slice(i, 2 * i))),
            "experts.down_proj.weight": ("down_weight", ()),
            "experts.gate_up_proj": ("gate_up_weight", ()),
            "experts.down_proj": ("down_weight", ()),
        }
        for e in range(self.num_experts):
            names[f"experts.{e}.{gate}.weight"] = ("gate_up_weight", (e, slice(0, i)))
            names[f"experts.{e}.{up}.weight"] = ("gate_up_weight", (e, slice(i, 2 * i)))
            names[f"experts.{e}.{down}.weight"] = ("down_weight", (e,))
        return names

    def parameter_counts(self) -> tuple[int, int]:
        """(parameters, parameters a token uses): the router and its k experts."""
        per_expert = (self.gate_up_weight[0].numel() + self.down_weight[0].numel())
        router = self.router_weight.numel()
        return router + per_expert * self.num_experts, router + per_expert * self.top_k
