"""The native CPU prefill-attention kernel (kernels/csrc/prefill_attention_cpu.c) against SDPA, in one run.

The baseline is what the engine ran before the kernel and still runs without it: K/V repeated over the query
heads of each group, then `scaled_dot_product_attention` (causal, 4-D, so its CPU flash kernel). Shapes:
SmolLM2's 9 query / 3 KV heads of 64, one whole prompt of L tokens per call (the throughput benchmark's
prompts are 10-270 tokens). Correctness is tests/kernels' business; reported: ms per call, GFLOP/s of the
causal work (2 x 2 x heads x L^2 / 2 x head_dim) and the kernel's speed against SDPA.

    taskset -c 1 .venv/bin/python bench/prefill_attention_cpu.py [--threads 1]
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

import torch
import torch.nn.functional as F

from folio.kernels import prefill_attention_cpu

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
LENGTHS = (40, 140, 270, 1000)


def per_call(fn, seconds: float = 0.5) -> float:
    """Best of three timings of `fn`, each over enough calls to fill `seconds`."""
    fn()
    start, calls = time.perf_counter(), 0
    while time.perf_counter() - start < seconds / 5:
        fn()
        calls += 1
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    ks, vs = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    return F.scaled_dot_product_attention(q.transpose(0, 1)[None], ks.transpose(0, 1)[None],
                                          vs.transpose(0, 1)[None], is_causal=True, scale=scale)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if not prefill_attention_cpu.AVAILABLE:
        print("the native prefill kernel is not built or this CPU has neither AVX-512F nor AVX2: nothing to compare")
        return 0
    torch.set_num_threads(args.threads)
    print(f"vector path: {prefill_attention_cpu._cpu_prefill.simd()}-bit (AVX-512 if 512, AVX2 if 256)")
    scale = HEAD_DIM**-0.5
    for dtype in (torch.float32, torch.bfloat16):
        for length in LENGTHS:
            g = torch.Generator().manual_seed(length)
            q, k, v = (torch.randn(length, h, HEAD_DIM, generator=g).to(dtype) for h in (HEADS, KV_HEADS, KV_HEADS))

            base = per_call(functools.partial(sdpa, q, k, v, scale))
            native = per_call(functools.partial(prefill_attention_cpu.prefill_attention_cpu, q, k, v, scale))
            flops = 2 * 2 * HEADS * length * length / 2 * HEAD_DIM
            print(f"{str(dtype).removeprefix('torch.'):9s} L={length:5d}  SDPA {base * 1e3:7.3f} ms "
                  f"({flops / base / 1e9:5.1f} GF/s)  native {native * 1e3:7.3f} ms ({flops / native / 1e9:5.1f} GF/s)"
                  f"  {base / native:5.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
