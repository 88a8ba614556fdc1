"""Greedy tokens from a float32 LM head on a CPU with bfloat16 instructions: a bfloat16 screen over the whole
vocabulary, then float32 for the few tokens it cannot rule out.

Greedy decoding needs each row's first maximum, not its logits. The LM head is the widest GEMM of a step
(SmolLM2: 49152 x 576, a fifth of a decode step's weight FLOPs), and where the CPU has AVX512-BF16 or AMX
oneDNN multiplies bfloat16 at twice float32's rate. The screen's logits ``s_j`` are within a bound of the
float32 GEMM's ``l_j`` that follows from the rounding of its operands and of its output alone:

    |s_j - l_j| <= A ||x|| ||w_j|| + U |s_j|,   A = 2u + u^2 + 2 gamma_K (1 + u)^2,  U = u / (1 - u)

(u = 2^-8, bfloat16's unit roundoff, for x, w_j and the output; gamma_K = K 2^-24 / (1 - K 2^-24) bounds the
float32 accumulation of either GEMM over the K inputs; Cauchy-Schwarz bounds sum |x_i w_ji| by ||x|| ||w_j||).
With W the largest ||w_j||, any token whose ``s_j`` falls below the bound of the screen's own maximum cannot be
the float32 maximum. The rest (on SmolLM2's hidden states, two per row at the median and 66 at most in 1,519
rows) get their float32 dot products, and the first maximum among them, in vocabulary order, is the token:
the float32 path's up to the summation order of one dot product, the freedom every float32 GEMM takes.

Rows whose screen is not finite (an overflowing or NaN hidden state) return None: the caller falls back to the
full float32 logits, which treat NaN as the maximum as ``max()`` does.
"""

from __future__ import annotations

import torch

from folio.engine.layers.linear import ONEDNN_BF16, linear, pack_for_onednn, packs
from folio.kernels import fused_cpu

_U = 2.0**-8  # bfloat16's unit roundoff (8 significant bits, round to nearest)
_SLACK = 1.0 + 2.0**-12  # for the rounding of the bound's own arithmetic (norms, products)
_CAP = 512  # candidates per row the native scan returns; a row with more (never seen) takes the PyTorch scan


def available(dtype: torch.dtype) -> bool:
    """Whether a model of this dtype gets the screen on this CPU: float32 weights and native bfloat16 GEMMs."""
    return dtype == torch.float32 and ONEDNN_BF16


class GreedyScreen:
    """Greedy tokens for hidden states ``x [B, K]`` under the LM head ``weight [V, K]`` (float32, kept by
    reference for the recomputed rows; the screen holds a bfloat16 copy, packed for oneDNN where the CPU has
    bfloat16 instructions: elsewhere it is correct but slow, and `available` says not to build one)."""

    def __init__(self, weight: torch.Tensor) -> None:
        assert weight.dtype == torch.float32 and weight.dim() == 2 and not weight.is_mkldnn
        self.weight = weight.detach()
        half = self.weight.to(torch.bfloat16)
        self.packed = pack_for_onednn(half) if packs(torch.bfloat16) else half
        k = self.weight.shape[1]
        gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
        self.a = 2 * _U + _U * _U + 2 * gamma * (1 + _U) ** 2
        self.max_row_norm = float(self.weight.double().norm(dim=1).max())

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        """Each row's greedy token, int64 [B]; None when some row's screen is not finite."""
        assert x.dim() == 2 and x.dtype == torch.float32 and x.shape[1] == self.weight.shape[1]
        screen = linear(x.to(torch.bfloat16), self.packed)  # [B, V] bfloat16
        first_max = fused_cpu.argmax(screen) if fused_cpu.supports(screen) else screen.max(dim=1).indices
        top = screen.gather(1, first_max.unsqueeze(1)).squeeze(1).double()
        spread = self.a * _SLACK * x.double().norm(dim=1) * self.max_row_norm  # A ||x|| W
        # the lower bound of the float32 maximum, then the least screen value that can still reach it
        floor = top - spread - _U / (1 - _U) * top.abs()
        need = floor - spread
        least = torch.where(need >= 0, need / (1 + _U / (1 - _U)), need / (1 - _U / (1 - _U)))
        if not bool(torch.isfinite(least).all()):
            return None
        # float32 holds the threshold only rounded: step it down past that rounding so that the test stays sound
        cut = (least - least.abs() * 2.0**-20 - 1e-30).float()
        rows, cols = _at_least(screen, cut)
        exact = torch.linalg.vecdot(x[rows], self.weight[cols])  # float32, one dot product per candidate
        batch = x.shape[0]
        best = torch.full((batch,), float("-inf")).scatter_reduce(0, rows, exact, "amax")
        at_best = exact == best[rows]
        tokens = torch.full((batch,), self.weight.shape[0], dtype=torch.long).scatter_reduce(
            0, rows[at_best], cols[at_best], "amin"
        )
        assert bool((tokens < self.weight.shape[0]).all()), "every row keeps its screen maximum as a candidate"
        return tokens


def _at_least(screen: torch.Tensor, cut: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, cols)`` of the entries of ``screen`` at or above their row's ``cut``, in row-major order."""
    if fused_cpu.supports(screen):
        idx, counts = fused_cpu.columns_at_least(screen, cut, _CAP)
        if int(counts.max()) <= _CAP:
            keep = torch.arange(_CAP) < counts.unsqueeze(1)
            return torch.arange(screen.shape[0]).repeat_interleave(counts), idx[keep]
    rows, cols = torch.nonzero(screen >= cut.unsqueeze(1), as_tuple=True)
    return rows, cols
