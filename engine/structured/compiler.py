"""Structured-output requests compiled to grammars over this model's vocabulary (xgrammar), once per
distinct constraint: compiled grammars are cached by `StructuredOutputsParams.key`, and concurrent requests
for one constraint share one compile. A compile runs in a worker thread and is bounded in time, so the
server compiles before it queues a request (nothing slow ever runs on the step loop) and a schema that
takes too long is refused with a 400 instead of hanging its request."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from folio.engine.rules import RuleError
from folio.engine.structured.params import StructuredOutputsParams

COMPILE_TIMEOUT_S = 10.0
CACHE_SIZE = 256  # compiled grammars kept (a 10-property schema's is a few hundred KB at SmolLM2's vocabulary)


class GrammarCompiler:
    """``tokenizer``: the model's Hugging Face tokenizer; ``vocab_size``: the width of its logits (the
    bitmask's); ``stop_token_ids``: the tokens that end an answer, which a complete grammar allows."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], *, threads: int = 2,
                 timeout_s: float = COMPILE_TIMEOUT_S) -> None:  # fmt: skip
        import xgrammar as xgr  # only engines that serve a structured request pay for the import

        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self._xgr = xgr
        self._compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)  # our cache
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grammar")
        self._lock = threading.Lock()
        self._done: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._pending: dict[tuple[str, str], Future[Any]] = {}
        self.vocab_size, self.timeout_s = vocab_size, timeout_s

    def cached(self, params: StructuredOutputsParams) -> Any | None:
        with self._lock:
            compiled = self._done.get(params.key())
            if compiled is not None:
                self._done.move_to_end(params.key())
            return compiled

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar of ``params``: from the cache, or compiled within ``timeout_s``. Raises
        `RuleError` naming ``params.param`` for a constraint that does not compile or compiles too slowly."""
        compiled = self.cached(params)
        if compiled is not None:
            return compiled
        key = params.key()
        with self._lock:
            future = self._pending.get(key)
            if future is None:
                future = self._pool.submit(self._compile, params)
                self._pending[key] = future
                future.add_done_callback(lambda f, key=key: self._settle(key, f))
        try:
            return future.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise RuleError(f"{params.param}: the {params.kind} constraint did not compile within "
                            f"{self.timeout_s:g} s; simplify it", param=params.param) from None  # fmt: skip

    def matcher(self, compiled: Any) -> Any:
        """A fresh matcher (one sequence's position in the grammar)."""
        return self._xgr.GrammarMatcher(compiled)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _settle(self, key: tuple[str, str], future: Future[Any]) -> None:
        with self._lock:
            self._pending.pop(key, None)
            if future.exception() is None:
                self._done[key] = future.result()
                while len(self._done) > CACHE_SIZE:
                    self._done.popitem(last=False)

    def _json_schema_grammar(self, schema: str | None) -> str:
        """The schema's grammar as xgrammar writes it, but for the characters of its strings: xgrammar allows
        control characters in length-bounded strings (``[^"\\\r\n]``), which JSON forbids unescaped, and
        UTF-16 surrogates (ED A0..BF xx) in every string, which are no UTF-8 text at all."""
        text = str(self._xgr.Grammar.from_json_schema(schema, any_whitespace=False))
        for char_class in _STRING_CHARS:
            text = text.replace(char_class, _JSON_STRING_CHAR)
        return text

    def _compile(self, params: StructuredOutputsParams) -> Any:
        c = self._compiler
        try:
            match params.kind:
                case "json":
                    return c.compile_grammar(self._json_schema_grammar(params.schema_text()))
                case "json_object":  # an object, as OpenAI's json_object means (xgrammar's builtin: any value)
                    return c.compile_grammar(self._json_schema_grammar('{"type":"object"}'))
                case "regex":
                    return c.compile_regex(params.regex)
                case "choice":
                    return c.compile_grammar("root ::= " + " | ".join(_literal(c) for c in params.choice or ()))
                case _:
                    return c.compile_grammar(params.grammar)
        except RuntimeError as exc:  # xgrammar's parse and conversion errors: the request's fault
            reason = str(exc).split("] ", 1)[-1].split(".cc:", 1)[-1].lstrip("0123456789: ").strip()
            raise RuleError(f"{params.param}: the {params.kind} constraint cannot be compiled: {reason}",
                            param=params.param) from None  # fmt: skip


# a string's characters as xgrammar prints them: [^\"\\\r\n] (length-bounded strings), [^\0-\x1f\"\\\r\n]
_STRING_CHARS = ('[^\\"\\\\\\r\\n]', '[^\\0-\\x1f\\"\\\\\\r\\n]')
# JSON's unescaped string characters, surrogates left out: [^\0-\x1f\"\\\uD800-\uDFFF]
_JSON_STRING_CHAR = '[^\\0-\\x1f\\"\\\\\\uD800-\\uDFFF]'


def _literal(text: str) -> str:
    """An EBNF string literal for ``text`` (JSON's escapes, which xgrammar's EBNF reads)."""
    return json.dumps(text, ensure_ascii=True)
