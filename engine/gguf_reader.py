"""gguf's `GGUFReader`, four times faster on files with large metadata.

The reader slices its `np.memmap` once per metadata value: 1.5 million times for Gemma 3's 262,144-token
vocabulary. Each slice of a memmap runs numpy's subclass hooks (`__getitem__`, `__array_finalize__`), and
each read made an empty array to learn its dtype's size: 10 s of parsing there. This reader keeps the same
mapping as a plain ndarray and slices it directly (under 3 s): tensors still map the file, nothing is read
early, and fields and tensors are the stock reader's (tests/engine/test_gguf_reader.py).

`transformers` reads a GGUF's config and tokenizer with the stock reader, imported from `gguf` when it is
called: `in_transformers` hands it this one instead (Gemma 3's config in 4 s, not 22).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gguf
import numpy as np


class GGUFReader(gguf.GGUFReader):
    @property
    def data(self) -> np.ndarray:
        return self._plain

    @data.setter
    def data(self, mapped: np.ndarray) -> None:
        # the stock __init__ assigns its np.memmap here before it parses anything
        self._plain = mapped.view(np.ndarray)

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: str | None = None) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = int(count)
        arr = self._plain[offset:offset + dtype.itemsize * count].view(dtype)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))


_swap = threading.Lock()


@contextmanager
def in_transformers() -> Iterator[None]:
    """transformers' GGUF loading (config, tokenizer, weights) reads with `GGUFReader` inside the block."""
    with _swap:  # one swap at a time: another thread's exit must not restore the stock reader under this one
        stock, gguf.GGUFReader = gguf.GGUFReader, GGUFReader
        try:
            yield
        finally:
            gguf.GGUFReader = stock
