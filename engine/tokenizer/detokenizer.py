"""Incremental detokenisation: text grows token by token and never ends in a split multi-byte character.

Byte-level BPE emits one UTF-8 character over several tokens; decoding a partial one yields U+FFFD. Text is
decoded from a short window of recent tokens (so sentencepiece's leading-space rules see their context) and
only released once it no longer ends in U+FFFD.
"""

from __future__ import annotations

from typing import Any

# Tokens of the prompt kept as decoding context for the first generated tokens.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.tokens: list[int] = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_id: int) -> str:
        """Append a generated token; return the newly complete text (possibly empty)."""
        self.tokens.append(token_id)
        prefix = self._decode(self.tokens[self.prefix_offset : self.read_offset])
        full = self._decode(self.tokens[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            new = full[len(prefix) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
            return new
        return ""
