"""The engine's two CPU-path choices, each against the alternative in the same run (float32, SmolLM2).

1. Decode attention: the native C kernel (reads the paged cache in place) against gather + SDPA in
   length buckets, as average time per attention call (one layer of one step) over the throughput
   workload (64 prompts of 8-200 words, --output-len tokens each). Calls of steps with prefill chunks
   count too (they also attend), so this is a per-call average of the engine's real mix.
2. Projections: time per projection (SmolLM2's and Gemma 3 270M's shapes) with
   MKL's `F.linear` on the weight row-major (as loaded) and column-major (what the engine does without
   oneDNN), and oneDNN's matmul on the row-major weight and on the weight prepacked into its blocked
   layout (`folio.engine.layers.linear`: what the engine does), at decode batches 8 and 64; and in
   bfloat16, `F.linear` against the prepacked weight at batches 64 and 256.

    .venv/bin/python bench/cpu_paths.py [--threads 1] [--output-len 64] [--projections-only]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def attention_ms_per_call(native: bool, output_len: int) -> tuple[float, float]:
    """(ms per attention call, whole-run seconds) with the native kernel on or off."""
    from throughput import model_dir, workload

    import folio.engine.layers.self_attention as self_attention
    from folio.engine import LLM, SamplingParams

    llm = LLM(str(model_dir("smollm2")), dtype="float32", kv_cache_memory_gib=2.0)
    llm.llm_engine.runner.native_decode = native and llm.llm_engine.runner.native_decode
    prompts = workload(64)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4))
    llm.llm_engine.block_manager.reset_prefix_cache()
    spent, calls = [0.0], [0]
    real = self_attention.paged_attention

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = real(*args, **kwargs)
        spent[0] += time.perf_counter() - start
        calls[0] += 1
        return out

    self_attention.paged_attention = timed
    try:
        start = time.perf_counter()
        llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True))
        total = time.perf_counter() - start
    finally:
        self_attention.paged_attention = real
    return spent[0] / calls[0] * 1e3, total


def linear_ms(f, x: torch.Tensor, w: torch.Tensor, repeats: int = 30) -> float:
    for _ in range(3):
        f(x, w)
    start = time.perf_counter()
    for _ in range(repeats):
        f(x, w)
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--projections-only", action="store_true", help="skip the attention comparison")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from throughput import model_dir

    from folio.engine.layers.linear import ONEDNN, ONEDNN_BF16, linear, pack_for_onednn
    from folio.kernels import decode_attention_cpu
    from tests.support.models import smollm2_safetensors

    smollm2_safetensors(model_dir("smollm2"))
    print(f"threads {args.threads}; native kernel built: {decode_attention_cpu.AVAILABLE}")
    if decode_attention_cpu.AVAILABLE and not args.projections_only:
        gather_ms, gather_s = attention_ms_per_call(False, args.output_len)
        native_ms, native_s = attention_ms_per_call(True, args.output_len)
        print(f"attention per layer call: gather + SDPA {gather_ms:.2f} ms (run {gather_s:.1f} s), "
              f"native {native_ms:.2f} ms (run {native_s:.1f} s); ratio {gather_ms / native_ms:.2f}x")
    if not ONEDNN:
        print("this torch has no oneDNN: the oneDNN column repeats MKL row-major")
    # SmolLM2-135M's and Gemma 3 270M's projections: fused QKV, output, fused gate/up, down; the LM head
    shapes = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
              "lm_head": (49152, 576), "gemma qkv": (1536, 640), "gemma o": (640, 1024),
              "gemma gate_up": (4096, 640), "gemma down": (640, 2048), "gemma lm_head": (262144, 640)}
    for batch in (8, 64):
        for name, (out_features, in_features) in shapes.items():
            x, w = torch.randn(batch, in_features), torch.randn(out_features, in_features)
            column_major = w.t().contiguous().t()
            assert torch.equal(F.linear(x, w), F.linear(x, column_major))
            torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=1e-4, atol=1e-3)  # rounding (|y| ~ 50)
            packed = pack_for_onednn(w) if ONEDNN else w
            torch.testing.assert_close(linear(x, packed), F.linear(x, w), rtol=1e-4, atol=1e-3)
            # alternating, each variant's best of three: the machine's speed drifts between measurements
            timings = [(linear_ms(F.linear, x, w), linear_ms(F.linear, x, column_major), linear_ms(linear, x, w),
                        linear_ms(linear, x, packed)) for _ in range(3)]
            row, col, dnn, dnn_packed = (min(t[i] for t in timings) for i in range(4))
            print(f"linear {name:14s} batch {batch:2d}: MKL row-major {row:7.3f} ms, column-major {col:7.3f} ms, "
                  f"oneDNN {dnn:7.3f} ms, prepacked {dnn_packed:7.3f} ms; oneDNN vs the better MKL "
                  f"{min(row, col) / dnn:.2f}x, prepacked vs row-major oneDNN {dnn / dnn_packed:.2f}x", flush=True)
    if not ONEDNN_BF16:
        print("no bfloat16 instructions for oneDNN here: bfloat16 weights are not prepacked")
        return 0
    for batch in (64, 256):  # bfloat16: F.linear (oneDNN, re-laid-out per call) against the prepacked weight
        for name, (out_features, in_features) in shapes.items():
            x = torch.randn(batch, in_features).bfloat16()
            w = (torch.randn(out_features, in_features) * 0.05).bfloat16()
            packed = pack_for_onednn(w)
            assert torch.equal(linear(x, packed), F.linear(x, w))  # the same GEMM, bit for bit
            timings = [(linear_ms(F.linear, x, w), linear_ms(linear, x, packed)) for _ in range(3)]
            plain, dnn_packed = (min(t[i] for t in timings) for i in range(2))
            flops = 2 * batch * out_features * in_features
            print(f"bfloat16 linear {name:14s} batch {batch:3d}: F.linear {plain:7.3f} ms, prepacked "
                  f"{dnn_packed:7.3f} ms ({flops / dnn_packed / 1e6:.0f} GFLOP/s); {plain / dnn_packed:.2f}x",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
