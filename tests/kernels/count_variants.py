"""Counts the Triton kernel variants an engine-like trace would compile, without a GPU.

Run as a script, in a process where TRITON_INTERPRET is unset. Every launch is specialized exactly as
Triton's JIT does it (`compile_for_gpu.specialize`) and its cache key recorded instead of compiled. The
engine's start-up warm-up (`warm_up_decode`, and one prefill standing for the profiling step) runs first;
then eager decode steps over batches 1–32 and contexts 1–8k (on views past a mixed step's prefills, as the
engine passes them), and prefills of 1–32 sequences whose block tables grow with them. The split counts are
chosen as for an H200's 132 SMs. Prints one JSON object: per kernel, the variants warmed and those the
trace added.
Used by test_compile_counts.py.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

assert not os.environ.get("TRITON_INTERPRET"), "run without TRITON_INTERPRET: the kernels must be JITFunctions"
sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from compile_for_gpu import intercept_launches, specialize  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

BLOCK = 16
KV_HEADS, HEADS, HEAD_DIM = 8, 32, 128  # Llama-3-8B's attention
MAX_MODEL_LEN = 8192
H200_SMS = 132
seen: dict[str, set[str]] = defaultdict(set)


def _record_instead_of_launch(self: JITFunction, *args: object, grid: object, warmup: bool, **kwargs: object) -> None:
    _, specialization, options = specialize(self, *args, **kwargs)
    seen[self.__name__].add(repr((specialization, sorted(vars(options).items()) if hasattr(options, "__dict__")
                                  else options)))


def main() -> int:
    intercept_launches(_record_instead_of_launch)
    from folio.kernels import decode_attention_triton
    from folio.kernels.decode_attention import paged_decode_attention
    from folio.kernels.decode_attention_triton import warm_up_decode

    decode_attention_triton.sm_count = lambda device: H200_SMS  # split counts as on an H200
    from folio.kernels.prefill_attention import paged_prefill_attention

    bf16, cpu = torch.bfloat16, torch.device("cpu")
    blocks = MAX_MODEL_LEN // BLOCK
    k_cache = torch.zeros(blocks, BLOCK, KV_HEADS, HEAD_DIM, dtype=bf16)
    v_cache = torch.zeros_like(k_cache)

    def prefill(num_seqs: int, tokens_each: int, context: int) -> None:
        q = torch.zeros(num_seqs * tokens_each, HEADS, HEAD_DIM, dtype=bf16)
        cu = torch.arange(0, num_seqs * tokens_each + 1, tokens_each, dtype=torch.int32)
        lens = torch.full((num_seqs,), context, dtype=torch.int32)
        tables = torch.zeros(num_seqs, -(-context // BLOCK), dtype=torch.int32)
        paged_prefill_attention(q, k_cache, v_cache, cu, lens, tables, 0.1, backend="triton")

    warm_up_decode(HEADS, KV_HEADS, HEAD_DIM, BLOCK, bf16, cpu, max_context_len=MAX_MODEL_LEN)
    prefill(7, 300, 300)  # the profiling step
    warmed = {name: len(keys) for name, keys in seen.items()}

    for batch in range(1, 33):
        for context in (1, 15, 16, 17, 100, 255, 256, 257, 511, 1000, 2047, 2048, 3000, 4096, 5000, 8191):
            # A mixed step's decodes follow its prefills: the engine passes views that start past them,
            # whose pointers are not 16-byte aligned for every prefill count.
            skip = batch % 4
            q = torch.zeros(skip + batch, HEADS, HEAD_DIM, dtype=bf16)[skip:]
            lens = torch.full((skip + batch,), context, dtype=torch.int32)[skip:]
            tables = torch.zeros(skip + batch, -(-context // BLOCK), dtype=torch.int32)[skip:]
            for window in (None, 4096):
                paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.1, max_context_len=context,
                                       window=window, backend="triton")
        for context in (1, 16, 17, 160, 1000, 4096):
            prefill(batch, 1 if context == 1 else 16, context)
    print(json.dumps({name: {"warmed": warmed.get(name, 0), "after_trace": len(keys)}
                      for name, keys in sorted(seen.items())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
