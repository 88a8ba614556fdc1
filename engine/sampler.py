"""Token selection for a batch: logit bias and grammar masks, penalties, temperature, top-k / top-p / min-p,
then greedy or random.

Everything is batched over the sequences that need it. A request with a ``seed`` draws its random numbers
from its own `torch.Generator`, so its output does not depend on which requests share its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from folio.engine.sequence import Sequence
from folio.engine.structured import mask
from folio.kernels import fused_cpu

_FLOAT32_MAX = torch.finfo(torch.float32).max


@dataclass
class SampleResult:
    token_ids: list[int]
    # per sequence: {token: logprob} for the sampled token and the top-N (None when not requested)
    logprobs: list[dict[int, float] | None]
    sampled_logprobs: list[float]  # log-probability of each sampled token (0.0 when nobody asked)
    # speculation: per sequence, the proposed tokens the target kept, emitted before its own token above, and
    # their (logprob, top logprobs) as for that token; None when the step verified no proposal
    kept: list[list[int]] | None = None
    kept_logprobs: list[list[tuple[float, dict[int, float] | None]]] | None = None

    @classmethod
    def greedy(cls, token_ids: list[int]) -> SampleResult:
        """Plain greedy tokens: nobody asked for log-probabilities."""
        return cls(token_ids, [None] * len(token_ids), [0.0] * len(token_ids))


def plain_greedy(seqs: list[Sequence]) -> bool:
    """Whether each sequence takes its greedy token and asks for nothing else: no log-probabilities, no
    penalties and no constraint (a grammar, a logit bias), so that the first maximum of its raw logits is all
    it needs."""
    return all(s.params.greedy and s.params.logprobs is None and not s.params.has_penalties
               and not mask.constrained(s) for s in seqs)  # fmt: skip


class Sampler:
    def __init__(self, seed: int, device: torch.device) -> None:
        self.generator = torch.Generator(device=device)  # for requests without their own seed
        self.generator.manual_seed(seed)
        self.bitmasks = mask.BitmaskFiller(overlap=mask.spare_core(device))

    def prepare(self, seqs: list[Sequence], vocab_size: int) -> None:
        """At a step's start: what the step's sampling can compute before the logits exist (grammar masks)."""
        self.bitmasks.start(seqs, vocab_size)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SampleResult:
        """``logits`` [B, V] in float32 or the model's dtype, one row per sequence in ``seqs``. Everything but
        plain greedy decoding works in float32."""
        if plain_greedy(seqs):
            return SampleResult.greedy(first_max(logits).tolist())
        want = [s.params.logprobs for s in seqs]
        top_n = max((n for n in want if n is not None), default=None)
        greedy = [s.params.greedy for s in seqs]
        logits = logits.float()  # widening is exact: the greedy rows pick what they would above
        raw_logprobs = torch.log_softmax(logits, dim=-1) if top_n is not None else None
        if any(mask.constrained(s) for s in seqs):  # a bias and the grammar's mask, before everything else
            logits = mask.apply(logits, seqs, self.bitmasks.take(seqs))
        logits = self._apply_penalties(logits, seqs)
        tokens = first_max(logits) if all(greedy) else self._sample(logits, seqs, greedy)
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
        """Repetition, frequency and presence penalties for every penalised row at once: the token ids go
        over in one padded copy per kind (non-blocking from pinned memory on CUDA), then a few batched ops."""
        rows = [i for i, s in enumerate(seqs) if s.params.has_penalties]
        if not rows:
            return logits
        vocab = logits.shape[1]
        device = logits.device
        params = [seqs[i].params for i in rows]
        # ids past the vocabulary (and the padding) land in one extra column, dropped afterwards
        outputs = _padded([seqs[i].output_token_ids for i in rows], vocab, device)
        prompts = _padded([seqs[i].prompt_token_ids for i in rows], vocab, device)
        factors = _to_device(torch.tensor([[p.repetition_penalty, p.frequency_penalty, p.presence_penalty]
                                           for p in params], dtype=logits.dtype), device)
        rep, freq, presence = factors[:, 0:1], factors[:, 1:2], factors[:, 2:3]
        counts = torch.zeros(len(rows), vocab + 1, dtype=logits.dtype, device=device)
        counts.scatter_add_(1, outputs, torch.ones_like(outputs, dtype=logits.dtype))
        counts = counts[:, :vocab]
        seen = torch.zeros(len(rows), vocab + 1, dtype=torch.bool, device=device)
        seen.scatter_(1, prompts, True)
        seen = seen[:, :vocab] | (counts > 0)
        index = _to_device(torch.tensor(rows, dtype=torch.long), device)
        picked = logits.index_select(0, index)
        penalised = torch.where(picked > 0, picked / rep, picked * rep)   # rep 1.0 leaves a row as it is
        picked = torch.where(seen, penalised, picked) - freq * counts - presence * (counts > 0).to(logits.dtype)
        # a penalty near 0 divides a logit past float32's range; inf - inf would make the softmax NaN
        return logits.index_copy(0, index, picked.clamp_(-_FLOAT32_MAX, _FLOAT32_MAX))

    @staticmethod
    def distribution(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """What each row draws from, [B, V] float32: temperature, then top-k / top-p / min-p, which leave the
        rows unnormalised (the dropped tokens' mass is not handed out)."""
        device = logits.device
        temps = _to_device(torch.tensor([s.params.temperature or 1.0 for s in seqs]), device).unsqueeze(1)
        probs = torch.softmax((logits / temps).clamp_(-_FLOAT32_MAX, _FLOAT32_MAX), dim=-1)
        top_k = [s.params.top_k for s in seqs]
        top_p = [s.params.top_p for s in seqs]
        min_p = [s.params.min_p for s in seqs]
        if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
            probs = _top_k_top_p(probs, top_k, top_p)
        if any(m > 0 for m in min_p):
            mp = _to_device(torch.tensor(min_p), device).unsqueeze(1)
            probs = probs.masked_fill(probs < mp * probs.max(dim=-1, keepdim=True).values, 0.0)
        return probs

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], greedy: list[bool]) -> torch.Tensor:
        device = logits.device
        probs = self.distribution(logits, seqs)
        # Inverse-CDF sampling: one uniform draw per row, placed on the row's running sum of probabilities (a
        # token of probability 0 spans no width, so it is never drawn). The exponential race before it drew one
        # number per token: 7.5 ms a step for 8 rows of SmolLM2's 49k vocabulary on the CPU, a sixth of the step.
        u = torch.empty(len(seqs), 1, device=device)
        unseeded = [i for i, s in enumerate(seqs) if s.generator is None]
        if unseeded:
            u[unseeded] = torch.rand(len(unseeded), 1, generator=self.generator, device=device)
        for i, s in enumerate(seqs):
            if s.generator is not None:
                u[i] = torch.rand(1, generator=s.generator, device=device)
        cdf = probs.cumsum(dim=-1)
        tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)
        greedy_rows = [i for i, g in enumerate(greedy) if g]
        if greedy_rows:
            tokens[greedy_rows] = logits[greedy_rows].argmax(dim=-1)
        return tokens


def first_max(logits: torch.Tensor) -> torch.Tensor:
    """Each row's greedy token: the first maximum, as argmax() finds it. On the CPU the native kernel reads
    the logits in their own dtype at a tenth of max()'s cost; max() itself is a third of argmax()'s."""
    if fused_cpu.supports(logits) and logits.dim() == 2 and logits.shape[1] > 0 and logits.stride(1) == 1:
        return fused_cpu.argmax(logits)
    return logits.max(dim=-1).indices


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device`` without a host sync (pinned, non-blocking) when that is a GPU."""
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _padded(id_lists: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    """``[len(id_lists), longest]`` int64 of the ids, padded and clamped to ``pad``."""
    width = max(1, max(len(ids) for ids in id_lists))
    host = torch.full((len(id_lists), width), pad, dtype=torch.long)
    for row, ids in enumerate(id_lists):
        if ids:
            host[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return _to_device(host.clamp_(0, pad), device)


def _top_k_top_p(probs: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    vocab = probs.shape[1]
    # any k beyond the vocabulary (up to int64's limit, which the request allows) keeps every token
    ks = [min(k, vocab) if k > 0 else vocab for k in top_k]
    widest = max(ks)
    if widest < vocab:  # every row has a top-k: only the widest k candidates need ordering, not the vocabulary
        sorted_probs, order = probs.topk(widest, dim=-1)
    else:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(sorted_probs.shape[1], device=probs.device).unsqueeze(0)
    k = _to_device(torch.tensor(ks), probs.device).unsqueeze(1)
    drop = ranks >= k
    p = _to_device(torch.tensor(top_p, dtype=probs.dtype), probs.device).unsqueeze(1)
    # keep the smallest prefix whose mass reaches p (the token that crosses p stays)
    drop |= (sorted_probs.cumsum(dim=-1) - sorted_probs) >= p
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter_(1, order, sorted_probs)
