"""The pre-norm decoder layer of Llama and most families since: attention and feed-forward blocks, each
after an RMSNorm, each added to the residual stream (the add fused into the next norm)."""

from __future__ import annotations

import torch
from torch import nn

from folio.engine.layers.context import AttentionContext
from folio.engine.layers.norm import RMSNorm
from folio.engine.layers.self_attention import SelfAttention


class PreNormDecoderLayer(nn.Module):
    def __init__(
        self, hidden_size: int, eps: float, self_attn: SelfAttention, mlp: nn.Module, *, mlp_name: str = "mlp"
    ) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)
        self.mlp = mlp
        self.checkpoint_aliases = {"mlp": mlp_name}  # Mixtral calls its feed-forward block block_sparse_moe

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        ctx: AttentionContext,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``rows``: only those rows leave the layer (the last layer's, when only some rows get logits)."""
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, kv_cache, ctx, rows)
        if rows is not None:
            residual = residual[rows]
        x, residual = self.post_attention_layernorm(x, residual)
        if ctx.lora is not None:
            return self.mlp(x, ctx.lora.select(rows)), residual
        return self.mlp(x), residual
