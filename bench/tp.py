"""Tensor parallelism: TP=2 against TP=1 on the same machine (issue 18); with ``--pipeline``, pipeline
parallel 2 (PP=2, issue 46) beside them.

Gemma 3 270M float32 on the CPU (4 heads, 1 KV head, a 262k vocabulary: most of its weights are the
embedding table, which the ranks split; SmolLM2's 9 heads do not split in two), a random ~1B Llama in
bfloat16 on CUDA (a tiny one with ``--dry-run``), ``--prompts`` prompts of 8-200
words, ``--max-tokens`` output tokens each, greedy, ignore_eos. Each phase runs in its own process and
reports output tok/s, start-up time, each rank's weight bytes and resident memory (RSS) once loaded, and
whether its tokens match TP=1's. On the CPU the ranks split the cores (TP=1 uses them all); on CUDA each
rank has its own GPU (``--device cuda``; needs two). `bench/pipeline.py` measures the overlap of pipeline
stages on the CPU; here PP=2 is the GPU path's check (NCCL send/recv between two GPUs).

    .venv/bin/python bench/tp.py [--device cpu|cuda] [--model gemma3-270m|random-1b] [--prompts 16] [--max-tokens 64] [--pipeline] [--json FILE] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
# built on the machine for the GPU run (no hub): a Llama of about 1B parameters, 8 KV heads
RANDOM_1B = {"vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16,
             "num_attention_heads": 16, "num_key_value_heads": 8, "max_position_embeddings": 4096,
             "dtype": "bfloat16"}  # fmt: skip


PHASES = {"1": (1, 1), "2": (2, 1), "pp2": (1, 2)}  # name: (tensor, pipeline parallel size)


def run_phase(args: argparse.Namespace, name: str) -> dict:
    import psutil
    import torch

    from folio.engine import LLM, SamplingParams

    sys.path.insert(0, str(ROOT))
    from bench.throughput import prepare_model, workload
    from tests.support.models import make_tiny_llama

    if args.model == "gemma3-270m":
        path = prepare_model("gemma3-270m")
    else:
        path = Path(args.tmp) / args.model
        if not (path / "config.json").exists():
            make_tiny_llama(path, **(RANDOM_1B if args.model == "random-1b" else {}))
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    size, stages = PHASES[name]
    start = time.perf_counter()
    llm = LLM(str(path), dtype=dtype, device=args.device, max_model_len=1024, kv_cache_memory_gib=0.25,
              tensor_parallel_size=size, pipeline_parallel_size=stages)  # fmt: skip
    loaded = time.perf_counter() - start
    engine = llm.llm_engine
    weights = [sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())]
    rss = [psutil.Process().memory_info().rss]
    if engine.parallel is not None:
        weights += [w["bytes_read"] for w in engine.parallel.worker_stats]
        rss += [psutil.Process(p.pid).memory_info().rss for p in engine.parallel.procs]
    prompts = workload(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm-up
    if args.device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    engine.close()
    tokens = [o.outputs[0].token_ids for o in outs]
    return {
        "phase": name, "seconds": elapsed, "tok_s": sum(map(len, tokens)) / elapsed, "load_s": loaded,
        "weights_mib": [w / MIB for w in weights], "rss_mib": [r / MIB for r in rss], "tokens": tokens,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", choices=["gemma3-270m", "random-1b", "tiny"],
                        help="default: gemma3-270m (float32) on the CPU, random-1b (bfloat16, built here) on CUDA")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--pipeline", action="store_true", help="also pipeline parallel 2 (PP=2)")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--dry-run", action="store_true", help="a tiny random model, 2 prompts, 4 tokens")
    parser.add_argument("--phase", choices=list(PHASES), help=argparse.SUPPRESS)  # internal: run one phase, print JSON
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dry_run:
        args.prompts, args.max_tokens, args.model = 2, 4, "tiny"
    args.model = args.model or ("random-1b" if args.device == "cuda" else "gemma3-270m")
    if args.phase is not None:
        print(json.dumps(run_phase(args, args.phase)))
        return 0

    import tempfile

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in ("1", "2", "pp2") if args.pipeline else ("1", "2"):
            cmd = [sys.executable, __file__, "--phase", size, "--device", args.device, "--model", args.model,
                   "--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens), "--tmp", tmp]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                print(proc.stdout + proc.stderr, file=sys.stderr)
                return 1
            results[size] = json.loads(proc.stdout.strip().splitlines()[-1])
    base = results["1"]
    print(f"tensor parallelism on {args.device}, {args.model}: {args.prompts} prompts x {args.max_tokens} tokens, greedy")
    print("| TP (pp2: PP=2) | output tok/s | vs TP=1 | start-up | weights per rank (MiB) | RSS per rank (MiB) | tokens = TP=1 |")
    print("|---|---|---|---|---|---|---|")
    for size, r in results.items():
        same = r["tokens"] == base["tokens"]
        weights = " / ".join(f"{w:.0f}" for w in r["weights_mib"])
        rss = " / ".join(f"{m:.0f}" for m in r["rss_mib"])
        print(f"| {size} | {r['tok_s']:.1f} | {r['tok_s'] / base['tok_s']:.2f}x | {r['load_s']:.1f} s | {weights} "
              f"| {rss} | {'yes' if same else 'NO'} |")
    if args.json:
        slim = {size: {k: v for k, v in r.items() if k != "tokens"} | {"tokens_match_tp1": r["tokens"] == base["tokens"]}
                for size, r in results.items()}  # fmt: skip
        Path(args.json).write_text(json.dumps(slim, indent=1))
    # a tiny float32 model must match exactly; a real one may diverge where two logits tie to rounding
    return 1 if args.dry_run and any(r["tokens"] != base["tokens"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
