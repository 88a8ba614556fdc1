"""Structured-output requests compiled to grammars over this model's vocabulary, once per distinct
constraint: compiled grammars are cached by `StructuredOutputsParams.key`, and concurrent requests for one
constraint share one compile. A compile runs in a worker thread and is bounded in time, so the server
compiles before it queues a request (nothing slow ever runs on the step loop) and a schema that takes too
long is refused with a 400 instead of hanging its request.

Two backends (``--structured-outputs-backend``, as vLLM's flag): xgrammar (`XGrammarCompiler`, the default)
and llguidance (`GuidanceCompiler`). A matcher of either has ``accept_token``, ``is_terminated`` and
``fill_next_token_bitmask(bitmask, row)`` over the same packed int32 bitmask (`folio.engine.structured.mask`).
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, ClassVar

from folio.engine.rules import RuleError
from folio.engine.structured.params import StructuredOutputsParams

COMPILE_TIMEOUT_S = 10.0
CACHE_SIZE = 256  # compiled grammars kept (a 10-property schema's is a few hundred KB at SmolLM2's vocabulary)


class GrammarCompiler(ABC):
    """A backend's compiles, cached and bounded in time. ``tokenizer``: the model's Hugging Face tokenizer;
    ``vocab_size``: the width of its logits (the bitmask's); ``stop_token_ids``: the tokens that end an
    answer, which a complete grammar allows."""

    name: ClassVar[str]

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], *, threads: int = 2,
                 timeout_s: float = COMPILE_TIMEOUT_S) -> None:  # fmt: skip
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grammar")
        self.threads = threads
        # re-entrant: a compile that is over before its callback is added runs the callback (_settle) at once,
        # in the thread that holds the lock to add it
        self._lock = threading.RLock()
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

    @abstractmethod
    def matcher(self, compiled: Any) -> Any:
        """A fresh matcher (one sequence's position in the grammar)."""

    @abstractmethod
    def _compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled constraint; `RuleError` naming ``params.param`` when it cannot be."""

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _settle(self, key: tuple[str, str], future: Future[Any]) -> None:
        with self._lock:
            self._pending.pop(key, None)
            if future.exception() is None:
                self._done[key] = future.result()
                while len(self._done) > CACHE_SIZE:
                    self._done.popitem(last=False)


class XGrammarCompiler(GrammarCompiler):
    """xgrammar: grammars compiled ahead into token-mask caches (vLLM's and SGLang's default)."""

    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], **kwargs: Any) -> None:
        import xgrammar as xgr  # only engines that serve a structured request pay for the import

        super().__init__(tokenizer, vocab_size, stop_token_ids, **kwargs)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self._xgr = xgr
        self._compiler = xgr.GrammarCompiler(info, max_threads=self.threads, cache_enabled=False)

    def matcher(self, compiled: Any) -> Any:
        return self._xgr.GrammarMatcher(compiled)

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
        except UnicodeDecodeError:  # xgrammar's message quoted part of a character it could not read
            reason = "it does not parse (near a character the parser cannot read)"
        raise RuleError(f"{params.param}: the {params.kind} constraint cannot be compiled: {reason}",
                        param=params.param)  # fmt: skip


# a string's characters as xgrammar prints them: [^\"\\\r\n] (length-bounded strings), [^\0-\x1f\"\\\r\n]
_STRING_CHARS = ('[^\\"\\\\\\r\\n]', '[^\\0-\\x1f\\"\\\\\\r\\n]')
# JSON's unescaped string characters, surrogates left out: [^\0-\x1f\"\\\uD800-\uDFFF]
_JSON_STRING_CHAR = '[^\\0-\\x1f\\"\\\\\\uD800-\\uDFFF]'


def _literal(text: str) -> str:
    """An EBNF string literal for ``text`` (JSON's escapes, which xgrammar's EBNF reads)."""
    return json.dumps(text, ensure_ascii=True)


class GuidanceCompiler(GrammarCompiler):
    """llguidance: a lexer and an Earley parser that compute each mask as it is asked for (vLLM's
    ``guidance`` backend). A compiled constraint is its validated grammar text; each matcher parses it."""

    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int], **kwargs: Any) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        super().__init__(tokenizer, vocab_size, stop_token_ids, **kwargs)
        self._llg, self._fill = llguidance, llguidance.torch.fill_next_token_bitmask
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=stop_token_ids or None)

    def matcher(self, compiled: Any) -> GuidanceMatcher:
        return GuidanceMatcher(self._llg.LLMatcher(self._tokenizer, compiled, log_level=0), self._fill)

    def _compile(self, params: StructuredOutputsParams) -> Any:
        m = self._llg.LLMatcher
        try:
            match params.kind:
                case "json":  # compact JSON, as xgrammar's: no whitespace for a model to wander in
                    grammar = m.grammar_from_json_schema(params.schema_text(), defaults={"whitespace_flexible": False})
                case "json_object":
                    grammar = m.grammar_from_json_schema('{"type":"object"}', defaults={"whitespace_flexible": False})
                case "regex":
                    grammar = m.grammar_from_regex(params.regex)
                case "choice":
                    grammar = m.grammar_from_lark("start: " + " | ".join(_literal(c) for c in params.choice or ()))
                case _:
                    grammar = self._llg.grammar_from("grammar", params.grammar)  # GBNF or Lark
            error = m.validate_grammar(grammar, self._tokenizer)
        except (ValueError, RuntimeError) as exc:  # a grammar the converter cannot read
            error = str(exc)
        if error:
            reason = " ".join(error.split())
            raise RuleError(f"{params.param}: the {params.kind} constraint cannot be compiled: {reason}",
                            param=params.param)  # fmt: skip
        return grammar


class GuidanceMatcher:
    """An llguidance matcher behind xgrammar's matcher methods (what the sampler and the scheduler call)."""

    def __init__(self, matcher: Any, fill: Any) -> None:
        self._m, self._fill = matcher, fill  # fill: llguidance.torch.fill_next_token_bitmask

    def accept_token(self, token: int) -> bool:
        return bool(self._m.consume_token(token))

    def is_terminated(self) -> bool:
        return bool(self._m.is_stopped())

    def rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)

    def fill_next_token_bitmask(self, bitmask: Any, row: int) -> None:
        self._fill(self._m, bitmask, row)


BACKENDS: dict[str, type[GrammarCompiler]] = {c.name: c for c in (XGrammarCompiler, GuidanceCompiler)}
