"""Kernel benchmark (GPU): paged decode attention bandwidth, paged prefill throughput, engine decode speed.

Decode: achieved K/V bytes per second of ``paged_decode_attention`` against the GPU's peak HBM
bandwidth and against torch SDPA on the same K/V gathered into dense tensors (the best case for
SDPA: no paging), for batch 1/16/64/256 x context 512/2k/8k, bfloat16, head_dim 128, GQA 8:1
(64 query heads, 8 KV heads: Llama-3-70B's geometry). Prefill: TFLOP/s of ``paged_prefill_attention``
against SDPA (causal) on the same shapes. Times come from ``triton.testing.do_bench`` (L2 flushed
between runs) on CUDA-graph replays. Engine decode: tokens per second of whole decode steps (scheduler,
forward pass, sampling) of the engine on SmolLM2-135M (bfloat16), with its CUDA graphs and with
``enforce_eager=True``, at batch 1/16/64, in the same run. Without CUDA it prints why and exits 0.

    python bench/gpu_kernels.py [--peak-tbps 4.8] [--quick] [--section all|kernels|engine]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Peak HBM bandwidth (TB/s) by device-name fragment (first match wins), from the vendors' data sheets.
PEAK_TBPS = {"GH200": 4.0, "H200": 4.8, "H100 NVL": 3.9, "H100 PCIe": 2.0, "H100": 3.35,
             "B200": 8.0, "A100-SXM4-80GB": 2.04, "A100 80GB PCIe": 1.94, "A100": 1.56, "L40S": 0.864,
             "L4": 0.3, "A10G": 0.6}

DECODE_BATCHES = (1, 16, 64, 256)
CONTEXTS = (512, 2048, 8192)
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 64, 8, 128, 16
DTYPE = torch.bfloat16
ENGINE_MAX_MODEL_LEN = 131072  # Llama-3.1's context: the bound the engine's CUDA graphs pass
FIGURES: dict[str, Any] = {}  # every figure printed, for --json
JSON_PATH: Path | None = None  # --json: rewritten after every row, so a run cut short keeps what it measured


def record(section: str, row: dict[str, Any]) -> None:
    FIGURES.setdefault(section, []).append(row)
    if JSON_PATH is not None:
        JSON_PATH.write_text(json.dumps(FIGURES, indent=1))


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


def flash_decode_ms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: torch.Tensor) -> float | None:
    """flash-attn's decode kernel on dense ``[B, L, Hkv, D]`` K/V, or None when flash-attn is not installed."""
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        return None
    return time_ms(lambda: flash_attn_with_kvcache(q[:, None], k, v, cache_seqlens=lens))


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
    print(f"as engine: max_context_len = max_model_len {ENGINE_MAX_MODEL_LEN} (the CUDA graphs' bound); "
          "flash: flash-attn's kvcache kernel on dense K/V, when importable")
    print(f"{'batch':>6} {'context':>8} {'folio us':>9} {'TB/s':>6} {'% peak':>7} {'engine us':>9} {'sdpa us':>8} "
          f"{'sdpa TB/s':>9} {'speedup':>8} {'flash us':>8}")
    for ctx in contexts:
        for batch in batches:
            blocks = ctx // BLOCK_SIZE
            tables = pages[: batch * blocks].view(batch, blocks)
            lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
            q = torch.randn(batch, HEADS, HEAD_DIM, device="cuda", dtype=DTYPE)
            ours = time_ms(lambda q=q, t=tables, n=lens, c=ctx: paged_decode_attention(
                q, k_cache, v_cache, t, n, scale, max_context_len=c))
            # as the engine's CUDA graphs call it: the bound is max_model_len, not this batch's longest context,
            # over block tables as wide as that bound
            wide = torch.zeros(batch, ENGINE_MAX_MODEL_LEN // BLOCK_SIZE, device="cuda", dtype=torch.int32)
            wide[:, :blocks] = tables
            as_engine = time_ms(lambda q=q, t=wide, n=lens: paged_decode_attention(
                q, k_cache, v_cache, t, n, scale, max_context_len=ENGINE_MAX_MODEL_LEN))
            slots = (tables.long()[:, :, None] * BLOCK_SIZE + torch.arange(BLOCK_SIZE, device="cuda")).flatten(1)
            k = k_cache.view(-1, KV_HEADS, HEAD_DIM)[slots].transpose(1, 2)      # [B, Hkv, L, D] gathered
            v = v_cache.view(-1, KV_HEADS, HEAD_DIM)[slots].transpose(1, 2)
            baseline, backend = sdpa_baseline(q[:, :, None], k, v, causal=False, may_expand_kv=False)
            base = time_ms(baseline)
            flash = flash_decode_ms(q, k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous(), lens)
            del k, v
            kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD_DIM * k_cache.element_size()
            tbps, base_tbps = kv_bytes / ours / 1e9, kv_bytes / base / 1e9
            pct = f"{100 * tbps / peak:6.1f}%" if peak else "     ?"
            flash_text = f"{flash * 1e3:>8.1f}" if flash else f"{'-':>8}"
            print(f"{batch:>6} {ctx:>8} {ours * 1e3:>9.1f} {tbps:>6.2f} {pct:>7} {as_engine * 1e3:>9.1f} "
                  f"{base * 1e3:>8.1f} {base_tbps:>9.2f} {base / ours:>7.2f}x {flash_text}  (sdpa: {backend})",
                  flush=True)
            record("decode", {
                "batch": batch, "context": ctx, "folio_us": ours * 1e3, "tbps": tbps,
                "pct_peak": 100 * tbps / peak if peak else None, "as_engine_us": as_engine * 1e3,
                "sdpa_us": base * 1e3, "sdpa_backend": backend, "flash_attn_us": flash * 1e3 if flash else None})
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
        record("prefill", {
            "seqs": batch, "length": length, "folio_ms": ours, "tflops": flops / ours / 1e9, "sdpa_ms": base})
    print("target: >= 0.8x of SDPA (ratio = sdpa time / folio time)")


ENGINE_BATCHES = (1, 16, 64)
ENGINE_PROMPT_TOKENS = 32
ENGINE_DECODE_STEPS = 64
# Real per-layer geometries (bf16, random weights built on the GPU machine itself: nothing to upload);
# ``--layers`` trims the depth so that building, saving and loading fit the run (full depth: 32 and 28).
GEOMETRIES: dict[str, dict[str, Any]] = {
    "Llama-3-8B": dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0),
    "Qwen2.5-7B": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, rope_theta=1000000.0),
}
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)  # > the tokenizer's 512: ids it lacks


def random_model(folder: Path, geometry: dict[str, Any], layers: int, device: str, dtype: torch.dtype) -> Path:
    """A random-weight model folder at ``geometry`` (safetensors, with a small byte-level tokenizer: prompts
    are token ids, and ids past the tokenizer's vocabulary detokenize to nothing)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for tests.support
    from tests.support.models import _save_tokenizer

    settings = dict(geometry)
    model_type = settings.pop("model_type")
    config = AutoConfig.for_model(model_type, num_hidden_layers=layers, max_position_embeddings=8192,
                                  bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                                  **settings)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    _save_tokenizer(folder, 512)
    return folder


def bench_prompts(batch: int, vocab: int) -> list[list[int]]:
    return [[3 + (31 * i + 7 * j) % (min(vocab, 20000) - 3) for j in range(ENGINE_PROMPT_TOKENS)]
            for i in range(batch)]


def engine_decode_tok_s(llm: object, batch: int, steps: int, vocab: int) -> float:
    """Output tokens per second over ``steps`` decode-only steps of ``batch`` sequences (prefill excluded)."""
    from folio.engine import SamplingParams

    engine = llm.llm_engine  # type: ignore[attr-defined]
    params = SamplingParams(temperature=0.0, max_tokens=steps + 1, ignore_eos=True)
    for i, prompt in enumerate(bench_prompts(batch, vocab)):
        engine.add_request(f"bench-{batch}-{steps}-{i}", prompt, params)
    started: set[str] = set()
    while len(started) < batch:  # prefill: every sequence gets its first token
        started.update(o.request_id for o in engine.step())
    sync()
    start, tokens = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        tokens += len(engine.step())  # one output per sequence that got a token; sampling syncs the step
    return tokens / (time.perf_counter() - start)


def generate_tok_s(model: Any, batch: int, steps: int, vocab: int, device: str) -> float:
    """transformers ``generate`` on a static batch (greedy, no early stop): decode tokens per second, the
    prefill's time measured alone and taken out."""
    ids = torch.tensor(bench_prompts(batch, vocab), device=device)
    kwargs = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def run(new_tokens: int) -> float:
        sync()
        start = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, **kwargs)
        sync()
        return time.perf_counter() - start

    run(2)  # warm-up
    prefill = run(1)
    return batch * (steps - 1) / max(run(steps) - prefill, 1e-9)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bench_engine(batches: tuple[int, ...], layers: int, device: str, dtype: torch.dtype, *, tiny: bool,
                 geometries: tuple[str, ...] = tuple(GEOMETRIES)) -> None:
    """Engine decode tok/s with CUDA graphs and eager, against transformers ``generate`` on the same model."""
    from transformers import AutoModelForCausalLM

    from folio.engine import LLM

    steps = 4 if tiny else ENGINE_DECODE_STEPS
    for name in geometries:
        geometry = GEOMETRIES[name]
        if tiny:
            geometry = {"model_type": geometry["model_type"], **TINY}
        vocab = geometry["vocab_size"]
        with tempfile.TemporaryDirectory(prefix="folio-bench-") as tmp:
            start = time.perf_counter()
            folder = random_model(Path(tmp), geometry, layers, device, dtype)
            built = time.perf_counter() - start
            print(f"\nEngine decode: {name} geometry, {layers} layers, {str(dtype).removeprefix('torch.')}, random "
                  f"weights (built and saved in {built:.1f} s), {ENGINE_PROMPT_TOKENS}-token prompts, {steps} "
                  f"decode steps", flush=True)
            rows: dict[str, dict[int, float]] = {}
            modes = (False, True) if device == "cuda" else (True,)
            for eager in modes:
                start = time.perf_counter()
                llm = LLM(str(folder), dtype=str(dtype).removeprefix("torch."), device=device, max_model_len=2048,
                          max_num_seqs=max(batches), enable_prefix_caching=False, enforce_eager=eager,
                          **({"gpu_memory_utilization": 0.85} if device == "cuda" else {"kv_cache_memory_gib": 0.5}))
                mode = "eager" if eager else "graphs"
                print(f"  engine ({mode}) ready in {time.perf_counter() - start:.1f} s", flush=True)
                rows[mode] = {}
                for batch in batches:
                    engine_decode_tok_s(llm, batch, 4, vocab)  # warm-up: Triton compiles new shapes on first use
                    rows[mode][batch] = engine_decode_tok_s(llm, batch, steps, vocab)
                del llm
                free_memory()
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
            rows["transformers"] = {b: generate_tok_s(model, b, steps, vocab, device) for b in batches}
            del model
            free_memory()
        modes_shown = list(rows)
        print(f"{'batch':>6} " + " ".join(f"{m + ' tok/s':>19}" for m in modes_shown) + f" {'engine/generate':>16}")
        for batch in batches:
            best = max(rows[m][batch] for m in modes_shown if m != "transformers")
            ratio = best / rows["transformers"][batch]
            print(f"{batch:>6} " + " ".join(f"{rows[m][batch]:>19.0f}" for m in modes_shown) + f" {ratio:>15.2f}x",
                  flush=True)
            record("engine", {
                "model": name, "layers": layers, "batch": batch, **{f"{m}_tok_s": rows[m][batch] for m in rows},
                "engine_over_generate": ratio})
    print("target: engine tok/s >= 10x transformers generate (static batch) on the same GPU")


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def dry_run() -> int:
    """What the GPU check imports and runs, on the CPU at tiny sizes: the kernels' modules, the baselines'
    imports and the engine section end to end (tiny geometry, eager, CPU), so a broken import or a renamed
    call shows up before a GPU is spent on it."""
    import importlib.util

    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: F401
    from triton.testing import do_bench  # noqa: F401

    import folio.kernels.decode_attention
    import folio.kernels.prefill_attention  # noqa: F401

    print(f"flash-attn importable: {importlib.util.find_spec('flash_attn') is not None}")
    bench_engine((1, 2), 2, "cpu", torch.float32, tiny=True)
    print("bench/gpu_kernels.py --dry-run: ok")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-tbps", type=float, default=None, help="peak HBM bandwidth, TB/s (default: by GPU name)")
    parser.add_argument("--quick", action="store_true", help="context 2k only (a smoke run)")
    parser.add_argument("--section", choices=("all", "kernels", "decode", "prefill", "engine"), default="all",
                        help="decode/prefill attention (kernels: both); engine: engine decode vs transformers")
    parser.add_argument("--layers", type=int, default=4, help="depth of the engine section's random models")
    parser.add_argument("--geometry", choices=tuple(GEOMETRIES), action="append", default=None,
                        help="the engine section's geometry (repeatable; default: every one)")
    parser.add_argument("--json", type=Path, default=None, help="write every figure to this JSON file")
    parser.add_argument("--dry-run", action="store_true", help="import everything, run the engine section tiny on CPU")
    args = parser.parse_args()
    global JSON_PATH
    JSON_PATH = args.json
    if args.dry_run:
        return dry_run()
    if not torch.cuda.is_available():
        print("bench/gpu_kernels.py: no CUDA device here; the kernel benchmark needs a GPU (skipped).")
        return 0
    name = torch.cuda.get_device_name()
    peak = peak_tbps(name, args.peak_tbps)
    import triton

    FIGURES.update(gpu=name, peak_tbps=peak, torch=torch.__version__, cuda=torch.version.cuda, triton=triton.__version__)
    print(f"GPU: {name}; peak HBM bandwidth: {f'{peak} TB/s' if peak else 'unknown (pass --peak-tbps)'}; "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}")
    contexts = (2048,) if args.quick else CONTEXTS
    torch.manual_seed(0)
    try:
        if args.section in ("all", "kernels", "decode"):
            bench_decode(peak, contexts, DECODE_BATCHES)
        if args.section in ("all", "kernels", "prefill"):
            bench_prefill(contexts)
        if args.section in ("all", "engine"):
            bench_engine(ENGINE_BATCHES, args.layers, "cuda", DTYPE, tiny=False,
                         geometries=tuple(args.geometry or GEOMETRIES))
    finally:
        if args.json:
            args.json.write_text(json.dumps(FIGURES, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
