"""Triton batched multi-LoRA (Punica's BGMV): a shrink and an expand kernel, each token reading its slot.

Each program reads its token's slot from the ``slots`` tensor on the device, so the grid depends only on the
shapes (``T``, ``R``, ``out``): a CUDA graph captured once stays right when the step's mix of adapters
changes, with no host synchronization and no recompilation. Programs of base-model tokens (slot -1) do
nothing. The products are elementwise multiply-and-sum, not ``tl.dot``: a token's row against its own
adapter is a matrix-vector product (decode's case), and it also keeps the kernels runnable in Triton's
interpreter for every dtype. The rank-``R`` intermediate is float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from folio.kernels._backend import ensure_launchable


@triton.jit
def _lora_shrink_kernel(
    x_ptr, a_ptr, slots_ptr, h_ptr,
    stride_x, stride_a_slot, stride_a_rank, stride_h,
    IN: tl.constexpr, R: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """h[t, r] = sum_k a[slots[t], r, k] * x[t, k] for one token and BLOCK_R ranks."""
    t = tl.program_id(0).to(tl.int64)
    s = tl.load(slots_ptr + t).to(tl.int64)
    if s >= 0:
        r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
        r_mask = r < R
        a_rows = a_ptr + s * stride_a_slot + r[:, None].to(tl.int64) * stride_a_rank
        acc = tl.zeros([BLOCK_R], dtype=tl.float32)
        for k0 in range(0, IN, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_mask = k < IN
            xv = tl.load(x_ptr + t * stride_x + k, mask=k_mask, other=0.0).to(tl.float32)
            av = tl.load(a_rows + k[None, :], mask=r_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(av * xv[None, :], axis=1)
        tl.store(h_ptr + t * stride_h + r, acc, mask=r_mask)


@triton.jit
def _lora_expand_kernel(
    h_ptr, b_ptr, slots_ptr, out_ptr,
    stride_h, stride_b_slot, stride_b_out, stride_out,
    OUT: tl.constexpr, R: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """out[t, n] += sum_r b[slots[t], n, r] * h[t, r] for one token and BLOCK_N outputs, rounded once."""
    t = tl.program_id(0).to(tl.int64)
    s = tl.load(slots_ptr + t).to(tl.int64)
    if s >= 0:
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = n < OUT
        b_rows = b_ptr + s * stride_b_slot + n[:, None].to(tl.int64) * stride_b_out
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for r0 in range(0, R, BLOCK_R):
            r = r0 + tl.arange(0, BLOCK_R)
            r_mask = r < R
            hv = tl.load(h_ptr + t * stride_h + r, mask=r_mask, other=0.0)
            bv = tl.load(b_rows + r[None, :], mask=n_mask[:, None] & r_mask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(bv * hv[None, :], axis=1)
        o = out_ptr + t * stride_out + n
        prev = tl.load(o, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(o, (prev + acc).to(out_ptr.dtype.element_ty), mask=n_mask)


def add_lora_triton(
    out: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """Launches on inputs checked by ``folio.kernels.lora`` (non-empty, unit last strides, contiguous slots)."""
    ensure_launchable(_lora_shrink_kernel, x.device)
    tokens, in_features = x.shape
    _, rank, _ = a.shape
    out_features = out.shape[1]
    # Never read for slot -1 tokens, so left uninitialized.
    h = torch.empty(tokens, rank, dtype=torch.float32, device=x.device)
    block_r = min(triton.next_power_of_2(rank), 64)
    block_k = min(triton.next_power_of_2(in_features), 128)
    _lora_shrink_kernel[(tokens, triton.cdiv(rank, block_r))](
        x, a, slots, h,
        x.stride(0), a.stride(0), a.stride(1), h.stride(0),
        IN=in_features, R=rank, BLOCK_R=block_r, BLOCK_K=block_k,
        num_warps=4,
    )
    block_n = min(triton.next_power_of_2(out_features), 128)
    _lora_expand_kernel[(tokens, triton.cdiv(out_features, block_n))](
        h, b, slots, out,
        h.stride(0), b.stride(0), b.stride(1), out.stride(0),
        OUT=out_features, R=rank, BLOCK_N=block_n, BLOCK_R=block_r,
        num_warps=4,
    )
    return out
