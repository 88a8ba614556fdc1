"""Token selection for a batch: penalties, temperature, top-k / top-p / min-p, then greedy or random.

Everything is batched over the sequences that need it. A request with a ``seed`` draws its random numbers
from its own `torch.Generator`, so its output does not depend on which requests share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from folio.engine.sequence import Sequence

_FLOAT32_MAX = torch.finfo(torch.float32).max


@dataclass
class SampleResult:
    token_ids: list[int]
    # per sequence: {token: logprob} for the sampled token and the top-N (None when not requested)
    logprobs: list[dict[int, float] | None]
    sampled_logprobs: list[float]  # log-probability of each sampled token (0.0 when nobody asked)


class Sampler:
    def __init__(self, seed: int, device: torch.device) -> None:
        self.generator = torch.Generator(device=device)  # for requests without their own seed
        self.generator.manual_seed(seed)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
        """``logits`` [B, V] float32, one row per sequence in ``seqs``."""
        want = [s.params.logprobs for s in seqs]
        top_n = max((n for n in want if n is not None), default=None)
        raw_logprobs = torch.log_softmax(logits, dim=-1) if top_n is not None else None
        logits = self._apply_penalties(logits, seqs)
        greedy = [s.params.greedy for s in seqs]
        if all(greedy):  # max() finds the first maximum like argmax(), at a third of its CPU cost
            tokens = logits.max(dim=-1).indices
        else:
            tokens = self._sample(logits, seqs, greedy)
        token_list = tokens.tolist()
        per_seq: list[dict[int, float] | None] = [None] * len(seqs)
        if raw_logprobs is None:
            return SampleResult(token_list, per_seq, [0.0] * len(seqs))
        sampled = raw_logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
        if top_n is not None:
            width = min(max(top_n, 1), raw_logprobs.shape[1])
            top_vals, top_ids = raw_logprobs.topk(width, dim=-1) if top_n else (None, None)
            for i, n in enumerate(want):
                if n is None:
                    continue
                entry = {token_list[i]: sampled[i]}
                if n and top_ids is not None and top_vals is not None:
                    entry.update(zip(top_ids[i, :n].tolist(), top_vals[i, :n].tolist(), strict=True))
                per_seq[i] = entry
        return SampleResult(token_list, per_seq, sampled)

    @staticmethod
    def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        rows = [i for i, s in enumerate(seqs) if s.params.has_penalties]
        if not rows:
            return logits
        logits = logits.clone()
        vocab = logits.shape[1]
        for i in rows:  # one vectorised update per penalised sequence
            p = seqs[i].params
            row = logits[i]
            out_ids = torch.tensor(seqs[i].output_token_ids, dtype=torch.long, device=logits.device)
            out_ids = out_ids[out_ids < vocab]
            counts = torch.zeros(vocab, device=logits.device).scatter_add_(0, out_ids, torch.ones_like(out_ids, dtype=torch.float))
            if p.repetition_penalty != 1.0:
                seen = counts > 0
                prompt = torch.tensor(seqs[i].prompt_token_ids, dtype=torch.long, device=logits.device)
                seen[prompt[prompt < vocab]] = True
                penalised = torch.where(row > 0, row / p.repetition_penalty, row * p.repetition_penalty)
                row = torch.where(seen, penalised, row)
            row = row - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).float()
            logits[i] = row
        # a penalty near 0 divides a logit past float32's range; inf - inf would make the softmax NaN
        return logits.clamp_(-_FLOAT32_MAX, _FLOAT32_MAX)

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], greedy: list[bool]) -> torch.Tensor:
        device = logits.device
        temps = torch.tensor([s.params.temperature or 1.0 for s in seqs], device=device).unsqueeze(1)
        probs = torch.softmax((logits / temps).clamp_(-_FLOAT32_MAX, _FLOAT32_MAX), dim=-1)
        top_k = [s.params.top_k for s in seqs]
        top_p = [s.params.top_p for s in seqs]
        min_p = [s.params.min_p for s in seqs]
        if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
            probs = _top_k_top_p(probs, top_k, top_p)
        if any(m > 0 for m in min_p):
            mp = torch.tensor(min_p, device=device).unsqueeze(1)
            probs = probs.masked_fill(probs < mp * probs.max(dim=-1, keepdim=True).values, 0.0)
        # Exponential race (argmax of p / E with E ~ Exp(1)) samples from p and needs one draw per token.
        noise = torch.empty_like(probs)
        unseeded = [i for i, s in enumerate(seqs) if s.generator is None]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), probs.shape[1], device=device).exponential_(
                generator=self.generator
            )
        for i, s in enumerate(seqs):
            if s.generator is not None:
                noise[i].exponential_(generator=s.generator)
        tokens = (probs / noise).argmax(dim=-1)
        greedy_rows = [i for i, g in enumerate(greedy) if g]
        if greedy_rows:
            tokens[greedy_rows] = logits[greedy_rows].argmax(dim=-1)
        return tokens


def _top_k_top_p(probs: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    vocab = probs.shape[1]
    ranks = torch.arange(vocab, device=probs.device).unsqueeze(0)
    # any k beyond the vocabulary (up to int64's limit, which the request allows) keeps every token
    k = torch.tensor([min(k, vocab) if k > 0 else vocab for k in top_k], device=probs.device).unsqueeze(1)
    drop = ranks >= k
    p = torch.tensor(top_p, device=probs.device).unsqueeze(1)
    # keep the smallest prefix whose mass reaches p (the token that crosses p stays)
    drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) >= p
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(1, order, sorted_probs)
