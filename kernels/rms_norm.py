"""RMSNorm and fused residual-add + RMSNorm, with the rounding of transformers' ``LlamaRMSNorm``.

``out = weight * (x / sqrt(mean(x**2) + eps))``: the statistic in float32, the normalized value
rounded to the input dtype before the weight is applied (exactly as transformers does it), and the
residual sum ``x + residual`` rounded to the input dtype before it is normalized.
"""

from __future__ import annotations

import torch

from folio.kernels._backend import Backend, use_triton
from folio.kernels._checks import FLOAT_DTYPES, check_tensor, require


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    residual_out = x + residual
    return rms_norm_ref(residual_out, weight, eps), residual_out


def _check(x: object, weight: object, eps: object) -> tuple[torch.Tensor, torch.Tensor]:
    w = check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES)
    require(isinstance(x, torch.Tensor) and x.dim() >= 1,
            lambda: f"x must be a tensor [..., hidden], got {getattr(x, 'shape', type(x).__name__)}")
    assert isinstance(x, torch.Tensor)
    x = check_tensor("x", x, ndim=x.dim(), dtypes=(w.dtype,), device=w.device)
    require(x.shape[-1] == w.shape[0], lambda: f"x's last dimension ({x.shape[-1]}) must equal weight's ({w.shape[0]})")
    require(isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps >= 0,
            lambda: f"eps must be a non-negative number, got {eps!r}")
    return x, w


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, backend: Backend = "auto") -> torch.Tensor:
    """RMSNorm over the last dimension of ``x[..., H]`` (``weight[H]``, same dtype) → a new tensor."""
    x, weight = _check(x, weight, eps)
    if use_triton(backend, x.device) and x.numel() > 0:
        from folio.kernels.rms_norm_triton import rms_norm_triton

        return rms_norm_triton(x, None, weight, float(eps))[0]
    return rms_norm_ref(x, weight, float(eps))


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *, backend: Backend = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)`` in one pass over memory."""
    x, weight = _check(x, weight, eps)
    residual = check_tensor("residual", residual, ndim=x.dim(), dtypes=(x.dtype,), device=x.device)
    require(residual.shape == x.shape, lambda: f"residual {tuple(residual.shape)} must match x {tuple(x.shape)}")
    if use_triton(backend, x.device) and x.numel() > 0:
        from folio.kernels.rms_norm_triton import rms_norm_triton

        out, residual_out = rms_norm_triton(x, residual, weight, float(eps))
        assert residual_out is not None
        return out, residual_out
    return fused_add_rms_norm_ref(x, residual, weight, float(eps))
