"""Triton RMSNorm (optionally fused with the residual add): one program per row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from folio.kernels._backend import ensure_launchable


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr,
    stride_x, stride_r, eps,
    HIDDEN: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # Rounded to the input dtype before normalizing, as the unfused model does.
        x = (x.to(tl.float32) + tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
             ).to(x.dtype)
        tl.store(residual_out_ptr + row * HIDDEN + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, 0) / HIDDEN + eps)
    w = tl.load(weight_ptr + cols, mask=mask)
    y = (xf * rstd).to(x.dtype).to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * HIDDEN + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Launches on inputs checked by ``folio.kernels.rms_norm``; outputs are new contiguous tensors."""
    ensure_launchable(_rms_norm_kernel, x.device)
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    res2 = residual.reshape(-1, hidden) if residual is not None else x2
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    residual_out = torch.empty_like(out) if residual is not None else None
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(x2.shape[0],)](
        x2, res2, weight, out, residual_out if residual_out is not None else out,
        x2.stride(0), res2.stride(0), eps,
        HIDDEN=hidden, BLOCK=block, HAS_RESIDUAL=residual is not None,
        num_warps=min(max(block // 512, 1), 16),
    )
    return out, residual_out
