"""The sampler's side of constrained decoding: ``logit_bias`` added, then each grammar-constrained row's
token bitmask applied (disallowed tokens to -inf), on the float32 logits of one step, before penalties,
temperature and the choice of a token. Rows that ask for neither are not touched."""

from __future__ import annotations

from typing import Any

import torch

from folio.engine.sequence import Sequence


def constrained(seq: Sequence) -> bool:
    """From the parameters alone, so that every tensor-parallel rank (whose mirrored sequences hold no
    grammar) takes the same path through the step."""
    return seq.params.structured_outputs is not None or bool(seq.params.logit_bias)


def apply(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """``logits`` [B, V] float32, one row per sequence; modified in place and returned."""
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
        bitmask = _bitmask(logits, [seqs[i].grammar for i in grammar_rows], grammar_rows)
        _xgr().apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=grammar_rows)
    return logits


def _bitmask(logits: torch.Tensor, matchers: list[Any], rows: list[int]) -> torch.Tensor:
    """The packed allow-bits of each constrained row (32 tokens an int32), filled by its matcher."""
    xgr = _xgr()
    bitmask = xgr.allocate_token_bitmask(logits.shape[0], logits.shape[1])
    for matcher, row in zip(matchers, rows, strict=True):
        matcher.fill_next_token_bitmask(bitmask, row)
    return bitmask


def _xgr() -> Any:
    import xgrammar

    return xgrammar
