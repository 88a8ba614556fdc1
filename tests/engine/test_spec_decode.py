"""Speculative decoding's parts on their own: the config, prompt lookup, and the rejection sampler's
exactness (the tokens it emits are distributed as the target's own draws)."""

from __future__ import annotations

import pytest
import torch

from folio.engine.spec_decode.config import SpeculativeConfig, SpeculativeConfigError
from folio.engine.spec_decode.ngram import NgramProposer
from folio.engine.spec_decode.rejection import verify

# --- config ---------------------------------------------------------------------------------------------


def test_vllms_json_is_read_with_its_defaults() -> None:
    ngram = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}')
    assert (ngram.method, ngram.num_speculative_tokens, ngram.prompt_lookup_max, ngram.prompt_lookup_min) == (
        "ngram", 4, 3, 2)
    draft = SpeculativeConfig.parse({"model": "/models/draft", "num_speculative_tokens": 3})
    assert (draft.method, draft.model, draft.num_speculative_tokens) == ("draft_model", "/models/draft", 3)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{nope", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"method": "eagle", "num_speculative_tokens": 2}', "method must be one of"),
        ('{"method": "ngram"}', "num_speculative_tokens is required"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "from 1 to 16"),
        ('{"method": "ngram", "num_speculative_tokens": 99}', "from 1 to 16"),
        ('{"method": "ngram", "num_speculative_tokens": true}', "from 1 to 16"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}',
         "exceeds"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "model": "/m"}', "takes no 'model'"),
        ('{"method": "draft_model", "num_speculative_tokens": 2}', "needs 'model'"),
        ('{"model": "/m", "num_speculative_tokens": 2, "prompt_lookup_max": 3}', "ngram only"),
        ('{"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}', r"unknown field\(s\) lookahead"),
    ],
)
def test_a_bad_config_is_refused_naming_the_field(value: str, message: str) -> None:
    with pytest.raises(SpeculativeConfigError, match=message):
        SpeculativeConfig.parse(value)


# --- prompt lookup ----------------------------------------------------------------------------------------


def test_the_longest_suffix_found_earlier_proposes_what_followed_it_most_recently() -> None:
    lookup = NgramProposer(3, lookup_min=1, lookup_max=3)
    assert lookup.propose([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 2, 3]) == [7, 8, 2]  # "2 3": last seen before 7 8
    # "1 2 3" (once, before 6 6 0) beats the more recent "2 3" (before 4 1 2): the longest suffix first
    assert lookup.propose([5, 1, 2, 3, 6, 6, 0, 2, 3, 4, 1, 2, 3]) == [6, 6, 0]
    assert lookup.propose([1, 2, 3, 4]) == []  # nothing repeats
    assert lookup.propose([7, 7]) == [7]  # what follows runs to the context's end
    assert lookup.propose([1, 2, 1, 2], k=1) == [1]
    assert NgramProposer(2, lookup_min=2, lookup_max=2).propose([4, 9, 1, 4, 9]) == [1, 4]
    assert NgramProposer(2, lookup_min=2, lookup_max=2).propose([4, 1, 9, 4, 9]) == []  # no 2-gram repeats


def test_a_match_is_whole_tokens_never_bytes_across_two() -> None:
    # 256 = 00 01 00 00 and 1 = 01 00 00 00: the bytes of "1" occur inside "256 0" off a token's boundary
    lookup = NgramProposer(2, lookup_min=1, lookup_max=1)
    assert lookup.propose([256, 0, 5, 1]) == []
    assert lookup.propose([256, 1, 5, 77, 1]) == [5, 77]
    big = [2**31 - 1, -5, 3, 2**31 - 1]
    assert lookup.propose(big) == [-5, 3]


# --- the rejection sampler ----------------------------------------------------------------------------------

V = 6


def distribution(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(V, generator=g) * 1.5, dim=-1)


def total_variation(counts: torch.Tensor, probs: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - probs).abs().sum())


def test_greedy_keeps_proposals_while_they_are_the_argmax() -> None:
    probs = torch.stack([torch.eye(V)[t] for t in (3, 1, 4, 2)])
    assert verify(probs, [3, 1, 4], greedy=True) == [3, 1, 4, 2]  # all kept, and the bonus
    assert verify(probs, [3, 5, 4], greedy=True) == [3, 1]  # the first refused is corrected, the rest go
    assert verify(probs[:1], [], greedy=True) == [3]


@pytest.mark.parametrize("with_draft", [False, True], ids=["one-hot (prompt lookup)", "a draft's distribution"])
def test_every_token_emitted_is_distributed_as_the_targets_own_draw(with_draft: bool) -> None:
    """Many verifications of 2 proposals: the first token emitted, and the second where the first was kept,
    each match the target's distribution at that position (total variation under 0.02 in 30,000 draws)."""
    target = torch.stack([distribution(1), distribution(2), distribution(3)])
    draft = torch.stack([distribution(4), distribution(5)])
    g = torch.Generator().manual_seed(0)
    first, second = torch.zeros(V), torch.zeros(V)
    kept = 0
    for _ in range(30_000):
        if with_draft:
            proposed = [int(torch.multinomial(draft[i], 1, generator=g)) for i in range(2)]
            out = verify(target, proposed, draft, generator=g)
        else:
            proposed = [2, 0]  # prompt lookup's proposals are not random
            out = verify(target, proposed, generator=g)
        first[out[0]] += 1
        if len(out) > 1 and out[0] == proposed[0]:
            second[out[1]] += 1
            kept += 1
    assert total_variation(first, target[0]) < 0.02
    assert kept > 1000 and total_variation(second, target[1]) < 0.03


def test_a_seeded_generator_gives_the_same_tokens() -> None:
    target = torch.stack([distribution(1), distribution(2), distribution(3)])
    runs = [[verify(target, [2, 0], generator=torch.Generator().manual_seed(7)) for _ in range(3)] for _ in range(2)]
    assert runs[0] == runs[1]
