"""Folio's GGUF reader reads what gguf's own reader reads, field by field and tensor by tensor, on
SmolLM2's GGUF (its 49,152-token vocabulary and merges are most of the metadata), and maps its tensors from
the file rather than reading them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from folio.engine.gguf_reader import GGUFReader, in_transformers


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def test_fields_and_tensors_are_the_stock_readers(smollm2_gguf_path: Path) -> None:
    stock, fast = gguf.GGUFReader(smollm2_gguf_path), GGUFReader(smollm2_gguf_path)
    assert list(fast.fields) == list(stock.fields)
    assert len(stock.fields["tokenizer.ggml.tokens"].data) == 49152
    for name, want in stock.fields.items():
        got = fast.fields[name]
        assert (got.offset, got.types, got.data) == (want.offset, want.types, want.data), name
        assert len(got.parts) == len(want.parts) and all(map(_same, got.parts, want.parts)), name
        assert got.contents() == want.contents(), name
    assert (fast.alignment, fast.data_offset, fast.endianess) == (stock.alignment, stock.data_offset, stock.endianess)
    assert len(fast.tensors) == len(stock.tensors) > 0
    for got, want in zip(fast.tensors, stock.tensors, strict=True):
        assert (got.name, got.tensor_type, got.n_elements, got.n_bytes, got.data_offset) == (
            want.name, want.tensor_type, want.n_elements, want.n_bytes, want.data_offset)
        assert np.array_equal(got.shape, want.shape) and _same(got.data, want.data), got.name
        # a view of the file's mapping, not a copy read into memory
        assert not got.data.flags.owndata and not got.data.flags.writeable
        assert np.shares_memory(got.data, fast.data)


def test_transformers_reads_a_gguf_through_it_inside_the_block(smollm2_gguf_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    stock = gguf.GGUFReader
    want = load_gguf_checkpoint(str(smollm2_gguf_path), return_tensors=False)["config"]
    opened: list[Any] = []
    init = GGUFReader.__init__

    def counting(self: GGUFReader, path: Any, *args: Any, **kwargs: Any) -> None:
        opened.append(path)
        init(self, path, *args, **kwargs)

    monkeypatch.setattr(GGUFReader, "__init__", counting)
    with in_transformers():
        got = load_gguf_checkpoint(str(smollm2_gguf_path), return_tensors=False)["config"]
    assert got == want and opened == [str(smollm2_gguf_path)]
    assert gguf.GGUFReader is stock
    with pytest.raises(RuntimeError), in_transformers():  # the stock reader is back whatever happens inside
        raise RuntimeError
    assert gguf.GGUFReader is stock
