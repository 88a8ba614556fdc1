"""The native CPU twin of paged decode attention (``kernels/csrc/paged_decode_cpu.c``).

It reads K/V in place from the paged cache, where the PyTorch path first gathers every sequence's blocks
into a dense copy. Built by ``pip install`` as an optional C extension; ``AVAILABLE`` says whether this
install has it. Inputs are checked by ``folio.kernels.decode_attention.paged_decode_attention``.
"""

from __future__ import annotations

import torch

from folio.kernels.native import load_native

_cpu_attention = load_native("_cpu_attention")  # None without a C compiler: callers use the PyTorch path

AVAILABLE = _cpu_attention is not None
DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def supports(q: torch.Tensor) -> bool:
    return AVAILABLE and q.device.type == "cpu" and q.dtype in DTYPES


def decode_attention_cpu(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, *, window: int | None = None, max_context_len: int | None = None,
) -> torch.Tensor:
    """``q [B, Hq, D]`` (unit last stride) over contiguous caches; block tables and lengths int32; a sliding
    ``window`` limits each query to its sequence's last ``window`` tokens. A length outside
    ``[0, max_context_len]`` (default: the block tables' capacity) raises ValueError, as does a block id
    outside the cache."""
    assert _cpu_attention is not None, "folio.kernels._cpu_attention was not built"
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and q.stride(-1) == 1
    block_tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    context_lens = context_lens.contiguous()
    batch, heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    _cpu_attention.paged_decode(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(), context_lens.data_ptr(),
        out.data_ptr(), batch, heads, kv_heads, head_dim, block_size, k_cache.shape[0], block_tables.stride(0),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), scale, DTYPES[q.dtype], torch.get_num_threads(),
        window or 0, block_tables.shape[1] * block_size if max_context_len is None else max_context_len,
    )
    return out
