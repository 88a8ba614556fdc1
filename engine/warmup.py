"""Start-up warm-up of the Triton kernels, so that no request pays for a compilation.

The profiling step (`folio.engine.memory_profile`) has already compiled the prefill-side kernels: a step's
sequence count, window and block-table width are not specialized on, so that one variant serves every
step. Decode attention is the kernel with several variants (one per split count, a power of two that
grows with the context): each one the engine can reach is launched once here on a one-token dummy.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from folio.engine.model_runner import ModelRunner

log = logging.getLogger(__name__)


def warm_up_kernels(runner: ModelRunner, max_model_len: int) -> list[int]:
    """Compiles every decode-attention variant ``runner`` can launch; returns their split counts (none
    without the kernel path)."""
    if not runner.use_kernels:
        return []
    from folio.kernels.decode_attention_triton import warm_up_decode

    cfg, cache = runner.cfg, runner.kv_caches[0][0]
    start = time.perf_counter()
    counts = warm_up_decode(
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, runner.block_size, cache.dtype,
        runner.device, max_context_len=max_model_len,
    )
    log.info("warmed up %d decode-attention variants (splits %s) in %.1f s",
             len(counts), ", ".join(map(str, counts)), time.perf_counter() - start)
    return counts
