"""Pipeline parallelism: two stages on this machine's two cores, overlapped against taking turns (issue 46).

SmolLM2-135M float32 (30 layers: 15 per stage), ``--prompts`` prompts of 8-200 words, ``--max-tokens``
output tokens each, greedy, ignore_eos. Three phases, each in its own process:

- ``pp1``: one process on both cores (the reference tokens);
- ``pp2-turns``: two stages of one core each, one micro-batch in flight: the stages alternate, as a
  pipeline without micro-batching does;
- ``pp2``: the same two stages with two micro-batches in flight (the engine's default), so that stage 1
  runs one while stage 0 runs the other.

Each reports output tok/s, the mean time of an engine step (one micro-batch's turn through the pipeline)
and whether its tokens match ``pp1``'s.

    .venv/bin/python bench/pipeline.py [--prompts 32] [--max-tokens 64] [--json FILE] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = {"pp1": (1, 1), "pp2-turns": (2, 1), "pp2": (2, 2)}  # name: (stages, micro-batches in flight)


def run_phase(args: argparse.Namespace, name: str) -> dict:
    from folio.engine import LLM, SamplingParams

    sys.path.insert(0, str(ROOT))
    from bench.throughput import prepare_model, workload
    from tests.support.models import make_tiny_llama

    if args.model == "smollm2":
        path = prepare_model("smollm2")
    else:
        path = Path(args.tmp) / "tiny"
        if not (path / "config.json").exists():
            make_tiny_llama(path, num_hidden_layers=4)
    stages, depth = PHASES[name]
    llm = LLM(str(path), dtype="float32", max_model_len=1024, kv_cache_memory_gib=0.25,
              pipeline_parallel_size=stages)  # fmt: skip
    engine = llm.llm_engine
    if stages > 1:
        engine.pipeline_depth = depth
    prompts = workload(args.prompts)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))  # warm-up
    steps = 0
    step = engine.step

    def counted() -> list:
        nonlocal steps
        steps += 1
        return step()

    engine.step = counted  # type: ignore[method-assign]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    llm.shutdown()
    tokens = [o.outputs[0].token_ids for o in outs]
    return {"phase": name, "seconds": elapsed, "tok_s": sum(map(len, tokens)) / elapsed, "steps": steps,
            "step_ms": 1000 * elapsed / max(steps, 1), "tokens": tokens}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--dry-run", action="store_true", help="a tiny random model, 4 prompts, 4 tokens")
    parser.add_argument("--phase", choices=list(PHASES), help=argparse.SUPPRESS)  # internal: one phase, as JSON
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dry_run:
        args.prompts, args.max_tokens, args.model = 4, 4, "tiny"
    if args.phase is not None:
        print(json.dumps(run_phase(args, args.phase)))
        return 0

    import tempfile

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in PHASES:
            cmd = [sys.executable, __file__, "--phase", name, "--model", args.model, "--prompts", str(args.prompts),
                   "--max-tokens", str(args.max_tokens), "--tmp", tmp]  # fmt: skip
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                print(proc.stdout + proc.stderr, file=sys.stderr)
                return 1
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    base, turns = results["pp1"], results["pp2-turns"]
    print(f"pipeline parallelism on the CPU, {args.model}: {args.prompts} prompts x {args.max_tokens} tokens, greedy")
    print("| phase | output tok/s | vs pp1 | vs pp2-turns | engine steps | ms per step | tokens = pp1 |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        same = r["tokens"] == base["tokens"]
        print(f"| {name} | {r['tok_s']:.1f} | {r['tok_s'] / base['tok_s']:.2f}x | {r['tok_s'] / turns['tok_s']:.2f}x "
              f"| {r['steps']} | {r['step_ms']:.1f} | {'yes' if same else 'NO'} |")
    if args.json:
        slim = {name: {k: v for k, v in r.items() if k != "tokens"} | {"tokens_match_pp1": r["tokens"] == base["tokens"]}
                for name, r in results.items()}  # fmt: skip
        Path(args.json).write_text(json.dumps(slim, indent=1))
    mismatch = any(r["tokens"] != base["tokens"] for r in results.values())
    return 1 if args.dry_run and mismatch else 0


if __name__ == "__main__":
    sys.exit(main())
