"""Which proposed tokens the target keeps: speculative sampling (Leviathan et al., Chen et al.), exact.

The target's distributions at the K+1 positions verified in one step (after the context, and after each
proposed token) decide. Proposed token ``d`` at a position, which the proposer drew with probability
``q(d)``, is kept with probability ``min(1, p(d) / q(d))``; at the first one refused, a token is drawn from
the residual ``max(0, p - q)`` renormalised instead and the rest go; when all K are kept, one more is drawn
from the last position's ``p``. Every token emitted is then distributed as the target alone would draw it.
Prompt lookup proposes without a distribution: ``q`` is one-hot, so ``d`` is kept with probability ``p(d)``
and the residual is ``p`` without ``d``. Greedy requests keep proposals while they are the target's argmax.
"""

from __future__ import annotations

import torch


def verify(target_probs: torch.Tensor, proposed: list[int], draft_probs: torch.Tensor | None = None, *,
           greedy: bool = False, generator: torch.Generator | None = None) -> list[int]:  # fmt: skip
    """The tokens to emit: the kept prefix of ``proposed`` and one more (the correction, or the bonus token).

    ``target_probs`` [K+1, V]: the target's distribution at each verified position (after sampling's own
    transforms: temperature, top-k/p, penalties, masks); ``draft_probs`` [K, V] the proposer's (None: one-hot).
    """
    k = len(proposed)
    assert target_probs.dim() == 2 and target_probs.shape[0] == k + 1, (tuple(target_probs.shape), k)
    assert draft_probs is None or tuple(draft_probs.shape) == (k, target_probs.shape[1])
    if greedy:
        return verify_greedy(target_probs.argmax(dim=-1).tolist(), proposed)
    device = target_probs.device
    draws = torch.rand(k, generator=generator, device=device).tolist() if k else []
    for i, d in enumerate(proposed):
        p = target_probs[i]
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        if q_d > 0 and draws[i] * q_d < float(p[d]):  # u < p(d) / q(d), without the division
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[d] = 0.0
        else:
            residual = (p - draft_probs[i]).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # (p == q to the last bit: nothing to correct towards)
            residual = p
        token = int(torch.multinomial(residual, 1, generator=generator))
        return [*proposed[:i], token]
    return [*proposed, int(torch.multinomial(target_probs[k], 1, generator=generator))]


def verify_greedy(best: list[int], proposed: list[int]) -> list[int]:
    """Greedy: the proposals while each is the target's choice ``best[i]`` at its position, then the
    target's own choice after them."""
    assert len(best) == len(proposed) + 1
    kept = next((i for i, d in enumerate(proposed) if best[i] != d), len(proposed))
    return [*proposed[:kept], best[kept]]
