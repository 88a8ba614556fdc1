"""RMSNorm, computed in float32 as `transformers` does: Llama's rounding and Gemma's (1 + weight) form."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folio.kernels import fused_cpu
from folio.kernels.rms_norm import fused_add_rms_norm, rms_norm


class RMSNorm(nn.Module):
    """Llama's: the normalized value is rounded to the input dtype before the weight multiplies it."""

    use_kernels = False  # set by the model: folio.kernels (CUDA) instead of the PyTorch code below

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op; the same float32 arithmetic as below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # transformers: h = x.float(); h * rsqrt(mean(h²) + eps), rounded, then times the weight
        return self.weight * F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without ``residual``: norm(x). With it: (norm(x + residual), x + residual)."""
        if self.use_kernels:
            if residual is None:
                return rms_norm(x, self.weight, self.eps)
            return fused_add_rms_norm(x, residual, self.weight, self.eps)
        if x.dim() == 2 and fused_cpu.supports(x):  # the native CPU op: one pass, the same roundings
            return fused_cpu.rms_norm(x, self.weight, self.eps, residual)
        if residual is None:
            return self._norm(x)
        x = x + residual
        return self._norm(x), x


class GemmaRMSNorm(nn.Module):
    """Gemma's: ``x * rsqrt(mean(x²) + eps) * (1 + weight)`` all in float32, rounded to the input dtype once.

    Checkpoints store ``weight`` (zero-centred); `finish_loading` keeps ``1 + weight`` in float32, the factor
    `transformers` computes on every call.
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)
        self.scale: torch.Tensor | None = None

    def finish_loading(self) -> None:
        self.scale = 1.0 + self.weight.detach().float()

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without ``residual``: norm(x). With it: (norm(x + residual), x + residual)."""
        assert self.scale is not None, "GemmaRMSNorm used before finish_loading()"
        if residual is not None:
            x = x + residual
        out = F.rms_norm(x.float(), self.scale.shape, self.scale, self.eps).to(x.dtype)
        return out if residual is None else (out, x)
