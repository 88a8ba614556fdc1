"""Builders for paged KV caches with scattered pages, and the dense attention they must reproduce."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

# Comparison tolerances per dtype. The interpreter rounds float32 → bfloat16 by truncation (the GPU
# rounds to nearest), so bfloat16 allows a little more than one rounding step.
TOL = {
    torch.float32: {"atol": 2e-5, "rtol": 1e-4},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2},
}


def skip_bf16_dot_in_interpreter(dtype: torch.dtype, device: torch.device) -> None:
    """Triton's interpreter multiplies the raw bits of bfloat16 operands in ``tl.dot`` (triton 3.9)."""
    if dtype == torch.bfloat16 and device.type != "cuda":
        pytest.skip("the Triton interpreter cannot run bfloat16 tl.dot; covered by the gpu tests")


@dataclass
class PagedKV:
    k_cache: torch.Tensor              # [num_blocks, block_size, kv_heads, head_dim]
    v_cache: torch.Tensor
    block_tables: torch.Tensor         # int32 [batch, max_blocks]
    context_lens: torch.Tensor         # int32 [batch]
    keys: list[torch.Tensor]           # per sequence, dense [len, kv_heads, head_dim]
    values: list[torch.Tensor]


def make_paged_kv(
    lens: list[int], block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
    device: torch.device | str, *, spare_blocks: int = 3, seed: int = 0,
) -> PagedKV:
    """Random K/V for each sequence, stored in randomly permuted pages of a cache filled with noise."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-n // block_size) for n in lens]
    max_blocks = max([*blocks_per_seq, 1]) + 1    # one unused column, filled with garbage
    num_blocks = sum(blocks_per_seq) + spare_blocks
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.randint(0, 1 << 30, (len(lens), max_blocks), generator=gen, dtype=torch.int32)
    keys, values, used = [], [], 0
    for b, (n, nb) in enumerate(zip(lens, blocks_per_seq, strict=True)):
        pages = perm[used : used + nb]
        used += nb
        tables[b, :nb] = pages.int()
        k = torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(n, kv_heads, head_dim, generator=gen).to(dtype)
        slots = pages.repeat_interleave(block_size) * block_size + torch.arange(block_size).repeat(nb)
        k_cache.view(-1, kv_heads, head_dim)[slots[:n]] = k
        v_cache.view(-1, kv_heads, head_dim)[slots[:n]] = v
        keys.append(k.to(device))
        values.append(v.to(device))
    return PagedKV(k_cache.to(device), v_cache.to(device), tables.to(device),
                   torch.tensor(lens, dtype=torch.int32, device=device), keys, values)


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None = None
) -> torch.Tensor:
    """torch SDPA on un-paged K/V: ``q[Tq, Hq, D]`` are the last Tq positions of ``k``/``v`` ``[L, Hkv, D]``;
    with a sliding ``window`` each query sees its last ``window`` positions only."""
    tq, length = q.shape[0], k.shape[0]
    if length == 0:
        return torch.zeros_like(q)
    causal = torch.ones(tq, length, dtype=torch.bool, device=q.device).tril(length - tq)
    if window is not None:
        causal = causal.triu(length - tq - window + 1)
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1), k.float().transpose(0, 1), v.float().transpose(0, 1),
        attn_mask=causal, scale=scale, enable_gqa=True,
    )
    return out.transpose(0, 1).to(q.dtype)
