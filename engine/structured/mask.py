"""The sampler's side of constrained decoding: ``logit_bias`` added, then each grammar-constrained row's
token bitmask applied (disallowed tokens to -inf), on the float32 logits of one step, before penalties,
temperature and the choice of a token. Rows that ask for neither are not touched.

The bitmask depends only on where each matcher stands, known before the step runs: where a core is free
for it (`spare_core`: always beside a GPU), `BitmaskFiller` fills it in a worker thread while the model's
forward runs (xgrammar releases the GIL), as vLLM and SGLang overlap it, and the sampler waits for it only
once the logits are there. On a CPU whose cores torch's threads all take, a thread beside the forward takes
one of them from it: there the sampler fills the bitmask itself, after the forward (measured on 2 cores,
SmolLM2, 16 constrained rows: 0.972× and 0.988× of the free rate filled in the sampler, 0.947× and 0.969×
beside the forward; bench/README.md, "Structured output")."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from folio.engine.sequence import Sequence
from folio.kernels import fused_cpu


def spare_core(device: torch.device) -> bool:
    """Whether a bitmask filled beside the forward runs on a core of its own: the forward runs on a GPU, or
    torch's threads leave a core of this machine free."""
    return device.type != "cpu" or (os.cpu_count() or 1) > torch.get_num_threads()


def constrained(seq: Sequence) -> bool:
    """From the parameters alone, so that every tensor-parallel rank (whose mirrored sequences hold no
    grammar) takes the same path through the step."""
    return seq.params.structured_outputs is not None or bool(seq.params.logit_bias)


class BitmaskFiller:
    """One step's bitmask, filled in the background from the step's start (`start`) until the sampler takes
    it (`take`). ``overlap`` False: never in the background, so the sampler fills it itself (for A/B runs)."""

    def __init__(self, overlap: bool = True) -> None:
        self.overlap = overlap
        self._pool: ThreadPoolExecutor | None = None  # made on first use: most engines constrain nothing
        self._pending: tuple[list[Sequence], Future[torch.Tensor]] | None = None

    def start(self, seqs: list[Sequence], vocab_size: int) -> None:
        """Begins filling the bitmask of ``seqs`` (the step's sampled sequences, in order) if any has a grammar."""
        self._pending = None
        rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
        if not rows or not self.overlap:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bitmask")
        matchers = [seqs[i].grammar for i in rows]
        self._pending = (seqs, self._pool.submit(_bitmask, len(seqs), vocab_size, matchers, rows))

    def wait(self) -> None:
        """Waits for the fill under way, if any, and drops it (before something else moves the matchers)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending[1].result()

    def take(self, seqs: list[Sequence]) -> torch.Tensor | None:
        """The bitmask begun for exactly these sequences, or None (then `apply` fills it itself). Waits for
        whatever fill is under way either way: no two threads ever move a matcher at once."""
        pending, self._pending = self._pending, None
        if pending is None:
            return None
        begun_for, future = pending
        bitmask = future.result()
        same = begun_for is seqs or [s.request_id for s in begun_for] == [s.request_id for s in seqs]
        return bitmask if same else None


def apply(logits: torch.Tensor, seqs: list[Sequence], bitmask: torch.Tensor | None = None) -> torch.Tensor:
    """``logits`` [B, V] float32, one row per sequence; modified in place and returned. ``bitmask``: the
    rows' bitmask filled ahead (`BitmaskFiller`), else it is filled here."""
    assert logits.dtype == torch.float32 and logits.shape[0] == len(seqs)
    biased = [(i, s.params.logit_bias) for i, s in enumerate(seqs) if s.params.logit_bias]
    if biased:
        rows, cols, values = [], [], []
        for i, bias in biased:
            for token, value in bias.items():
                rows.append(i)
                cols.append(token)
                values.append(value)
        index = (torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device))
        logits.index_put_(index, torch.tensor(values, dtype=logits.dtype, device=logits.device), accumulate=True)
    grammar_rows = [i for i, s in enumerate(seqs) if s.grammar is not None]
    if grammar_rows:
        if bitmask is None:
            bitmask = _bitmask(len(seqs), logits.shape[1], [seqs[i].grammar for i in grammar_rows], grammar_rows)
        if logits.device.type == "cpu" and fused_cpu.AVAILABLE:  # xgrammar's CPU loop branches on every bit
            fused_cpu.apply_bitmask(logits, bitmask, grammar_rows)
        else:
            _xgr().apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=grammar_rows)
    return logits


def constrained_rows(rows: torch.Tensor, seq: Sequence, draft: list[int]) -> torch.Tensor:
    """A verify step's rows of ``seq`` (its last token's, then one per proposal in ``draft``), as float32 with its
    logit bias and, under a grammar, each row's own mask: row j's is the grammar's after the first j proposals,
    so its matcher walks them as far as the grammar takes them, filling each mask, then steps back (the
    scheduler moves it past what is kept). Rows past a proposal the grammar refuses are never kept (that row
    cannot pick it): they stay unmasked. ``rows`` itself is not changed."""
    assert rows.shape[0] == len(draft) + 1
    bitmask = None
    matcher = seq.grammar
    if matcher is not None:
        bitmask = _xgr().allocate_token_bitmask(len(rows), rows.shape[1])  # every token allowed
        walked = 0
        for j in range(len(rows)):
            if matcher.is_terminated():  # an end accepted: nothing follows it
                break
            matcher.fill_next_token_bitmask(bitmask, j)
            if j == len(draft) or not _allowed(bitmask, j, draft[j]) or not matcher.accept_token(draft[j]):
                break
            walked += 1
        if walked:
            matcher.rollback(walked)
    return apply(rows.float().clone(), [seq] * len(rows), bitmask)


def _allowed(bitmask: torch.Tensor, row: int, token: int) -> bool:
    """Whether ``bitmask``'s ``row`` allows ``token`` (asked before the matcher takes it: llguidance's matcher
    takes a token it does not allow as an error it cannot step back from)."""
    return token // 32 < bitmask.shape[1] and bool((int(bitmask[row, token // 32]) >> (token % 32)) & 1)


def _bitmask(num_rows: int, vocab_size: int, matchers: list[Any], rows: list[int]) -> torch.Tensor:
    """The packed allow-bits of each constrained row (32 tokens an int32), filled by its matcher."""
    xgr = _xgr()
    bitmask = xgr.allocate_token_bitmask(num_rows, vocab_size)
    for matcher, row in zip(matchers, rows, strict=True):
        matcher.fill_next_token_bitmask(bitmask, row)
    return bitmask


def _xgr() -> Any:
    import xgrammar

    return xgrammar
