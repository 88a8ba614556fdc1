"""Prompt lookup (vLLM's ``ngram`` method): propose the tokens that followed the context's last n tokens the
last time they occurred in it, for the longest n from ``prompt_lookup_max`` down to ``prompt_lookup_min``.

Edits, quotes, summaries and code repeat their input, so what came after a phrase there often comes after
it again. The search runs in C: the context as 4-byte little-endian integers, and ``bytes.rfind`` for the
suffix (a match must start on a token's boundary, else the search goes on to the left).
"""

from __future__ import annotations

from array import array


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, lookup_min: int, lookup_max: int) -> None:
        assert 1 <= lookup_min <= lookup_max and num_speculative_tokens >= 1
        self.k, self.lookup_min, self.lookup_max = num_speculative_tokens, lookup_min, lookup_max

    def propose(self, token_ids: list[int] | array, k: int | None = None) -> list[int]:
        """Up to ``k`` (default: the configured number) tokens to verify after ``token_ids``; [] when no
        suffix of it occurs earlier."""
        k = self.k if k is None else k
        tokens = token_ids if isinstance(token_ids, array) and token_ids.typecode == "i" else array("i", token_ids)
        n_tokens = len(tokens)
        if k <= 0 or n_tokens < self.lookup_min + 1:
            return []
        haystack = tokens.tobytes()
        for n in range(min(self.lookup_max, n_tokens - 1), self.lookup_min - 1, -1):
            suffix = haystack[(n_tokens - n) * 4 :]
            stop = (n_tokens - 1) * 4  # a match ends before the context's last token, so a token follows it
            while (at := haystack.rfind(suffix, 0, stop)) >= 0:
                if at % 4 == 0:
                    start = at // 4 + n
                    return tokens[start : start + k].tolist()
                stop = at + n * 4 - 1  # it starts inside a token: look further left
        return []
