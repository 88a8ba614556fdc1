"""The Llama family (Llama, Mistral, Qwen2, SmolLM) as `transformers` configs describe it: RMSNorm, RoPE,
grouped-query attention, SwiGLU, tied or untied embeddings, optional q/k/v bias.

Q/K/V and gate/up projections are merged into one matrix each, so a layer makes four matmuls over all of
the step's tokens at once. Parameters are created empty; the loader fills them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folio.engine.config import ModelConfig
from folio.engine.layers.attention import paged_attention
from folio.engine.layers.context import AttentionContext
from folio.engine.layers.norm import RMSNorm
from folio.engine.layers.rotary import RotaryEmbedding, rotate

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
)


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape), requires_grad=False)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv_weight = _param(self.q_size + 2 * self.kv_size, cfg.hidden_size)
        self.qkv_bias = _param(self.q_size + 2 * self.kv_size) if cfg.attention_bias else None
        self.o_weight = _param(cfg.hidden_size, self.q_size)
        self.rotary = rotary

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        ctx: AttentionContext,
    ) -> torch.Tensor:
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        v = qkv[:, self.q_size + self.kv_size :].view(-1, self.num_kv_heads, self.head_dim)
        if ctx.rope_cos_sin is not None:  # PyTorch path: rotate q and k heads together in one pass
            qk = qkv[:, : self.q_size + self.kv_size].view(-1, self.num_heads + self.num_kv_heads, self.head_dim)
            q, k = rotate(qk, *ctx.rope_cos_sin).split([self.num_heads, self.num_kv_heads], dim=1)
        else:
            q = qkv[:, : self.q_size].view(-1, self.num_heads, self.head_dim)
            k = qkv[:, self.q_size : self.q_size + self.kv_size].view(-1, self.num_kv_heads, self.head_dim)
            q, k = self.rotary(positions, q, k)
        o = paged_attention(q, k, v, kv_cache[0], kv_cache[1], ctx, self.scale)
        return F.linear(o.reshape(-1, self.q_size), self.o_weight)


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_weight = _param(2 * cfg.intermediate_size, cfg.hidden_size)
        self.down_weight = _param(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_weight).chunk(2, dim=-1)
        return F.linear(F.silu(gate).mul_(up), self.down_weight)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = LlamaAttention(cfg, rotary)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)

    def forward(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        ctx: AttentionContext,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(positions, x, kv_cache, ctx)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_position: int) -> None:
        super().__init__()
        self.config = cfg
        self.rotary = RotaryEmbedding(cfg.head_dim, max_position, cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = _param(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, self.rotary) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = None if cfg.tie_word_embeddings else _param(cfg.vocab_size, cfg.hidden_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        ctx: AttentionContext,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] of the step's tokens (final norm applied)."""
        x = F.embedding(input_ids, self.embed_tokens)
        if not ctx.use_kernels:
            ctx.rope_cos_sin = self.rotary.cos_sin(positions, x.dtype)
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(positions, x, residual, kv_cache, ctx)
        x, _ = self.norm(x, residual)
        return x

    def store_weights_for_cpu_float32(self) -> None:
        """Keep each projection's weight [out, in] column-major, i.e. as a contiguous [in, out] matrix.

        `F.linear` multiplies by the weight's transpose; when that transpose is contiguous, MKL's float32
        GEMM reads it as is instead of re-laying-out the whole weight on every call, which at decode batch
        sizes is a large share of the work (bench/cpu_paths.py: 1.03-1.25x per projection, bit-identical).
        The embedding table stays row-major for its row lookups, and so does the LM head, which measured
        no faster (a wide [vocab, hidden] matrix).
        """
        for layer in self.layers:
            for param in layer.parameters():
                if param.dim() == 2:
                    param.data = param.data.t().contiguous().t()

    def use_kernels(self, enabled: bool) -> None:
        """Route norms and rotary embeddings through `folio.kernels` (on by default on CUDA)."""
        for module in self.modules():
            if isinstance(module, (RMSNorm, RotaryEmbedding)):
                module.use_kernels = enabled

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.embed_tokens if self.lm_head is None else self.lm_head
        return F.linear(hidden, weight).float()
