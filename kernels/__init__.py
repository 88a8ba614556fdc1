"""Folio's GPU kernels: paged attention, KV-cache store, RMSNorm, rotary embedding.

Every public function checks its inputs (a ``ValueError`` names the problem), then runs the Triton
kernel for CUDA tensors and its PyTorch reference twin otherwise (``backend=`` overrides that); decode
attention also has a native CPU twin (``kernels/csrc``, a C extension built by ``pip install``), which the
engine's CPU path uses and ``auto`` picks on the CPU where it was built. The
paged KV-cache layout they share is documented in ``folio.kernels.layout``. Triton itself is only
imported when a Triton kernel is launched.
"""

from folio.kernels.decode_attention import paged_decode_attention
from folio.kernels.kv_store import store_kvcache
from folio.kernels.prefill_attention import paged_prefill_attention
from folio.kernels.rms_norm import fused_add_rms_norm, rms_norm
from folio.kernels.rotary import apply_rotary_embedding, rope_cos_sin_cache

__all__ = [
    "apply_rotary_embedding",
    "fused_add_rms_norm",
    "paged_decode_attention",
    "paged_prefill_attention",
    "rms_norm",
    "rope_cos_sin_cache",
    "store_kvcache",
]
