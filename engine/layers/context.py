"""The per-step attention context: where each token's K/V goes and what each query may attend to.

Built once per step by the model runner and shared by all layers. The step's tokens are laid out as
``[prefill tokens (sequence after sequence) | decode tokens (one per sequence)]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from folio.engine.layers.lora import LoRAContext


@dataclass
class PrefillSegment:
    start: int  # first row of this sequence's queries in the step's tokens
    end: int
    context_len: int  # tokens of the sequence with K/V in the cache once this step's are stored
    block_table: torch.Tensor | None  # [num_blocks] int64; None when the segment is the whole context
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)  # per sliding window (PyTorch path)


@dataclass
class DecodeBucket:
    """Decode sequences of similar context length, attended together (less padding than one batch)."""

    start: int  # rows of the step's tokens
    end: int
    width: int  # blocks per sequence after padding
    flat_blocks: torch.Tensor  # [(end - start) * width] int64: the bucket's block tables, row-major
    mask: torch.Tensor  # [end - start, 1, 1, width * block_size] bool: which gathered keys are real
    _window_masks: dict[int, torch.Tensor] = field(default_factory=dict)

    def window_mask(self, window: int | None) -> torch.Tensor:
        """The mask of a layer with a sliding window: also hides the keys before each sequence's last W."""
        if window is None:
            return self.mask
        if window not in self._window_masks:
            lens = self.mask.sum(-1, keepdim=True)
            keys = torch.arange(self.mask.shape[-1], device=self.mask.device)
            self._window_masks[window] = self.mask & (keys >= lens - window)
        return self._window_masks[window]


@dataclass
class AttentionContext:
    slot_mapping: torch.Tensor  # [T] int64: cache slot of each token's K/V
    prefills: list[PrefillSegment]
    num_prefill_tokens: int
    # decode side (CPU path): the native kernel over block tables, or else gather K/V by block table into
    # reused buffers and mask the padding, bucket by bucket
    decode_block_tables: torch.Tensor | None = None  # [num_decodes, M] int32
    decode_context_lens: torch.Tensor | None = None  # [num_decodes] int32
    decode_buckets: list[DecodeBucket] = field(default_factory=list)
    gather_buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # each [blocks, block_size, Hkv, D]
    # PyTorch path: each rotary embedding's cos/sin [T, 1, rotary_dim/2] for this step, shared by its layers
    rope_cos_sin: dict[object, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # kernel side (folio.kernels contract; the CUDA path)
    use_kernels: bool = False
    max_context_len: int | None = None
    block_tables: torch.Tensor | None = None  # [S, M] int32, prefills then decodes
    context_lens: torch.Tensor | None = None  # [S] int32
    cu_seqlens_q: torch.Tensor | None = None  # [S + 1] int32
    # multi-LoRA: each token's adapter slot, only in a step with an adapter token (`folio.engine.layers.lora`)
    lora: LoRAContext | None = None
