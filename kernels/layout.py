"""The paged KV-cache layout: the one place that defines it. The engine imports these names.

Each attention layer owns one pair of tensors, ``k_cache`` and ``v_cache``, both

    [num_blocks, block_size, num_kv_heads, head_dim]        contiguous, model dtype

A *block* (page) holds ``block_size`` consecutive tokens of one sequence. A sequence's block table
lists the physical block of each of its logical blocks, so token ``t`` of the sequence lives in

    slot(t) = block_table[t // block_size] * block_size + t % block_size

and ``k_cache.view(-1, num_kv_heads, head_dim)[slot(t)]`` is its key (likewise for values).

* Slot mappings are 1-D integer tensors (int32 or int64) with one slot per new token; the slot
  ``PAD_SLOT_ID`` (-1) marks padding (e.g. a CUDA-graph batch padded to a captured size) and is skipped.
* Block tables are int32 ``[batch, max_blocks_per_seq]``; entries past a sequence's last block may hold
  any value (they are never read).
* ``context_lens`` (int32 ``[batch]``) counts every token of a sequence whose K/V is in the cache,
  including the ones just stored in this step. A context length of 0 yields a zero attention output.
* Any ``block_size`` works with the kernels (they look the page up per token); powers of two from 16
  upwards are the sizes that are tested and fast.
"""

from __future__ import annotations

import math
import mmap

import torch

PAD_SLOT_ID = -1
"""Slot-mapping value of a padding token: ``store_kvcache`` skips it."""

BLOCK_TABLE_DTYPE = torch.int32
CONTEXT_LENS_DTYPE = torch.int32
SLOT_MAPPING_DTYPES = (torch.int32, torch.int64)
KV_CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
POPULATE_CPU_CACHE = True  # see _zeros; bench/throughput.py's folio-faulting phase turns it off


def kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int) -> tuple[int, ...]:
    """The shape of one layer's ``k_cache`` (and ``v_cache``)."""
    return (num_blocks, block_size, num_kv_heads, head_dim)


def kv_cache_block_bytes(
    block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype, num_layers: int
) -> int:
    """Bytes one block costs across all layers, keys and values together (for sizing the cache)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize


def allocate_kv_cache(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One zeroed ``(k_cache, v_cache)`` pair per layer, in the layout above."""
    shape = kv_cache_shape(num_blocks, block_size, num_kv_heads, head_dim)
    return [(_zeros(shape, dtype, torch.device(device)), _zeros(shape, dtype, torch.device(device)))
            for _ in range(num_layers)]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    # Anonymous zero pages, mapped in at once (MAP_POPULATE) rather than faulted in as blocks fill: the
    # cache is reserved at start-up, as a GPU's is, and steps don't pay a fault per new page (on a VM each
    # is a trap to the hypervisor), which cost several per cent of a CPU run (bench/README.md).
    nbytes = max(1, math.prod(shape)) * torch.empty((), dtype=dtype).element_size()
    populate = getattr(mmap, "MAP_POPULATE", 0) if POPULATE_CPU_CACHE else 0
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    return torch.frombuffer(buffer, dtype=dtype, count=math.prod(shape)).view(shape)  # keeps ``buffer`` alive


def slots_for_positions(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """The slots of ``positions`` (token indices within one sequence) given its 1-D block table."""
    positions = positions.long()
    return block_table.long()[positions // block_size] * block_size + positions % block_size


def gather_sequence_kv(
    cache: torch.Tensor, block_table: torch.Tensor, length: int
) -> torch.Tensor:
    """The first ``length`` tokens of one sequence, copied out as a dense ``[length, num_kv_heads, head_dim]``."""
    block_size = cache.shape[1]
    slots = slots_for_positions(block_table, torch.arange(length, device=cache.device), block_size)
    return cache.view(-1, *cache.shape[2:])[slots]
