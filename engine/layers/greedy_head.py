"""Greedy tokens from a float32 LM head on a CPU with bfloat16 instructions: a bfloat16 screen over the whole
vocabulary, then float32 for the few tokens it cannot rule out.

Greedy decoding needs each row's first maximum, not its logits. The LM head is the widest GEMM of a step
(SmolLM2: 49152 x 576, a fifth of a decode step's weight FLOPs), and where the CPU has AVX512-BF16 or AMX
oneDNN multiplies bfloat16 at twice float32's rate. The screen's logits ``s_j`` are within a bound of the
float32 GEMM's ``l_j`` that follows from the rounding of its operands and of its output alone:

    |s_j - l_j| <= A ||x|| ||w_j|| + U |s_j|,   A = 2u + u^2 + 2 gamma_K (1 + u)^2,  U = u / (1 - u)

(u = 2^-8, bfloat16's unit roundoff, for x, w_j and the output; gamma_K = K 2^-24 / (1 - K 2^-24) bounds the
float32 accumulation of either GEMM over the K inputs; Cauchy-Schwarz bounds sum |x_i w_ji| by ||x|| ||w_j||).
A token whose ``s_j`` plus its bound falls short of the screen's maximum less that one's bound cannot be the
float32 maximum. The rest (on SmolLM2's hidden states, two per row at the median and 66 at most in 1,519
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
_REL = _U / (1 - _U) * (1 + 2.0**-20)  # U: the output's rounding, relative to the rounded value
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
        norms = self.weight.double().norm(dim=1) * _SLACK
        self.row_norms = norms.float()  # ||w_j||, rounded up past float32's rounding by the slack
        self.max_row_norm = float(norms.max())

    def candidates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(rows, cols)`` of the tokens the screen cannot rule out, in row-major order (each row's screened
        maximum among them); None when some row's screen is not finite."""
        assert x.dim() == 2 and x.dtype == torch.float32 and x.shape[1] == self.weight.shape[1]
        screen = linear(x.to(torch.bfloat16), self.packed)  # [B, V] bfloat16
        first_max = fused_cpu.argmax(screen) if fused_cpu.supports(screen) else screen.max(dim=1).indices
        top = screen.gather(1, first_max.unsqueeze(1)).squeeze(1).double()
        slope = self.a * _SLACK * x.double().norm(dim=1)  # A ||x||: times ||w_j||, token j's bound
        # the float32 maximum is at least the screened maximum less its bound; a token whose screened logit
        # plus its own bound falls short of that cannot be it
        floor = top - slope * self.row_norms[first_max].double() - _REL * top.abs()
        # the scan adds in float32: lower the floor past that arithmetic's rounding
        floor = floor - 2.0**-18 * (top.abs() + 2 * slope * self.max_row_norm) - 1e-30
        if not bool(torch.isfinite(floor).all()):
            return None
        return _reaching(screen, floor.float(), (slope * _SLACK).float(), self.row_norms)

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        """Each row's greedy token, int64 [B]; None when some row's screen is not finite."""
        found = self.candidates(x)
        if found is None:
            return None
        rows, cols = found
        exact = torch.linalg.vecdot(x[rows], self.weight[cols])  # float32, one dot product per candidate
        batch = x.shape[0]
        best = torch.full((batch,), float("-inf")).scatter_reduce(0, rows, exact, "amax")
        at_best = exact == best[rows]
        tokens = torch.full((batch,), self.weight.shape[0], dtype=torch.long).scatter_reduce(
            0, rows[at_best], cols[at_best], "amin"
        )
        assert bool((tokens < self.weight.shape[0]).all()), "every row keeps its screen maximum as a candidate"
        return tokens


def _reaching(
    screen: torch.Tensor, floor: torch.Tensor, slope: torch.Tensor, row_norms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, cols)`` of the screened logits that can reach their row's ``floor`` within their bound, in
    row-major order: ``s + REL |s| + slope[r] ||w_j|| >= floor[r]``."""
    if fused_cpu.supports(screen):
        idx, counts = fused_cpu.columns_reaching(screen, floor, slope, row_norms, _REL, _CAP)
        if int(counts.max()) <= _CAP:
            keep = torch.arange(_CAP) < counts.unsqueeze(1)
            return torch.arange(screen.shape[0]).repeat_interleave(counts), idx[keep]
    s = screen.float()
    reach = s + _REL * s.abs() + slope.unsqueeze(1) * row_norms.unsqueeze(0) >= floor.unsqueeze(1)
    rows, cols = torch.nonzero(reach, as_tuple=True)
    return rows, cols
