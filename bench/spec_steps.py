"""What a verify row costs at 8 sequences: SmolLM2 float32 decode steps by their row count, with and without
prompt lookup, offline (issue 45's 8-client level without the HTTP server and the client).

The grounded prompts of bench/spec_decode.py, 8 at a time (as 8 clients, each batch decoding in lockstep),
128 tokens each with ``ignore_eos``, after one untimed pass that puts the prompts into the prefix cache and
records the step graphs: what is timed is decode, in ``--rounds`` alternating rounds of both engines, each
engine's best kept (this machine's speed drifts by several percent from one minute to the next). The
speculating engine's own step costs (`StepCosts`, medians of the last steps of each row count) give, per row
count, what a step costs and what each row past the 8 sequences' own adds; a proposal at a position pays when
it is kept more often than that row's cost over the plain step's cost per token. Prints both engines' output tok/s and their ratio, the rows the per-step
budget chose, and how often a proposal was kept at each position.

    .venv/bin/python bench/spec_steps.py [--k 8] [--threads 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.serve import default_model  # noqa: E402
from bench.spec_decode import grounded_prompts  # noqa: E402

CLIENTS = 8


def timed(llm: Any, prompts: list[str], params: Any) -> tuple[int, float]:
    """(tokens, seconds) of the prompts, ``CLIENTS`` at a time."""
    started, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), CLIENTS):
        tokens += sum(len(o.outputs[0].token_ids) for o in llm.generate(prompts[i : i + CLIENTS], params))
    return tokens, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="alternating timed rounds; each engine's best kept")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    from folio.engine import LLM, SamplingParams

    torch.set_num_threads(args.threads)
    model, prompts = default_model(), grounded_prompts(args.num_prompts)
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    spec = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    engines: dict[str, Any] = {}
    rows: collections.Counter[int] = collections.Counter()
    for name, config in (("folio", None), ("folio + ngram", spec)):
        llm = engines[name] = LLM(model, dtype="float32", max_model_len=2048, kv_cache_memory_gib=2,
                                  speculative_config=config)  # fmt: skip
        timed(llm, prompts, params)  # the prompts into the prefix cache, the step graphs recorded
    speculator = engines["folio + ngram"].llm_engine.scheduler.speculator
    ran = speculator.step_ran

    def counted(n: int, seconds: float) -> None:
        rows[n] += 1
        ran(n, seconds)

    speculator.step_ran = counted
    rates: dict[str, float] = {}
    for round_ in range(1, args.rounds + 1):  # alternating, each engine's best kept: the machine drifts
        for name, llm in engines.items():
            tokens, seconds = timed(llm, prompts, params)
            rates[name] = max(rates.get(name, 0.0), tokens / seconds)
            print(f"round {round_}, {name}: {tokens} tokens in {seconds:.1f} s, {tokens / seconds:.1f} tok/s",
                  flush=True)
    for name, rate in rates.items():
        print(f"{name}: {rate:.1f} tok/s (best of {args.rounds})")
    costs, base = speculator.costs, speculator.costs.cost(CLIENTS)
    print(f"  rows a step ran (of {sum(rows.values())} decode steps): "
          + ", ".join(f"{n}: {c}" for n, c in sorted(rows.items()) if n >= CLIENTS))  # fmt: skip
    print(f"  kept at each position: {', '.join(f'{x:.2f}' for x in speculator.kept_at)}; "
          f"mean accepted length {speculator.stats.mean_accepted_length:.2f}")
    if base is not None:
        print(f"  step of {CLIENTS} rows: {base * 1e3:.1f} ms, {base * 1e3 / CLIENTS:.2f} ms a token")
        for n in sorted(r for r in rows if r > CLIENTS and rows[r] >= 9):
            cost = costs.cost(n)
            assert cost is not None
            extra = (cost - base) / (n - CLIENTS)
            print(f"  step of {n} rows: {cost * 1e3:.1f} ms, {extra * 1e3:.2f} ms a row past {CLIENTS}: "
                  f"a proposal pays when kept more than {extra / (base / CLIENTS):.0%} of the time")
    for llm in engines.values():
        llm.llm_engine.close()
    print(f"ratio: {rates['folio + ngram'] / rates['folio']:.2f}x with prompt lookup")


if __name__ == "__main__":
    main()
