"""Structured output (issue 42): constrained decoding against free decoding of the same lengths, and the
grammar compiler's cold and cached times.

SmolLM2-135M float32 on the CPU through the offline `LLM` API, ``--seqs`` (16) requests at once, sampled
(temperature 0.7, one seed per request). First the constrained run: each request's answer must fit a
10-property JSON schema (strings with bounds, integers with bounds, enums, a boolean, an array); its answers
are validated with jsonschema and their token counts kept. Then the free run: the same prompts with
``max_tokens`` set to those counts and ``ignore_eos``, so both runs make the same number of tokens per
request. The two alternate ``--rounds`` times; each keeps its fastest round. Output tok/s and the ratio
(target: constrained ≥ 0.95× free). The compile figures: the schema's first compile on a fresh engine's
compiler (cold) and the median of ``--repeats`` cached lookups (target ≤ 1 ms).

    .venv/bin/python bench/structured.py [--seqs 16] [--rounds 3] [--repeats 200] [--backend llguidance]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
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
TARGET_RATIO, TARGET_CACHED_MS = 0.95, 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", type=int, default=16, help="requests at once (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds; each run keeps its fastest")
    parser.add_argument("--repeats", type=int, default=200, help="cached compile lookups timed")
    parser.add_argument("--backend", choices=("xgrammar", "llguidance"), default="xgrammar",
                        help="--structured-outputs-backend (default: %(default)s)")  # fmt: skip
    args = parser.parse_args()

    import jsonschema

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

    prompts = [f"Describe person number {i}, a fictional character, as a JSON object." for i in range(args.seqs)]
    constrained = [SamplingParams(temperature=0.7, seed=i, max_tokens=300, structured_outputs=constraint)
                   for i in range(args.seqs)]  # fmt: skip
    lengths: list[int] = []
    best = {"constrained": float("inf"), "free": float("inf")}
    tokens = 0
    for _ in range(args.rounds):
        start = time.perf_counter()
        outs = llm.generate(prompts, constrained)
        best["constrained"] = min(best["constrained"], time.perf_counter() - start)
        for out in outs:
            assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
            jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
        lengths = [len(o.outputs[0].token_ids) for o in outs]
        tokens = sum(lengths)
        free = [SamplingParams(temperature=0.7, seed=i, max_tokens=n, ignore_eos=True) for i, n in enumerate(lengths)]
        start = time.perf_counter()
        outs = llm.generate(prompts, free)
        best["free"] = min(best["free"], time.perf_counter() - start)
        assert [len(o.outputs[0].token_ids) for o in outs] == lengths

    rate = {k: tokens / s for k, s in best.items()}
    ratio = rate["constrained"] / rate["free"]
    print(f"SmolLM2-135M float32, {args.backend}, {args.seqs} requests at once, {tokens} output tokens per run "
          f"({min(lengths)}-{max(lengths)} per request), best of {args.rounds} alternating rounds")  # fmt: skip
    print(f"{'run':<34} {'time':>8} {'output tok/s':>13}")
    print(f"{'free (same lengths, ignore_eos)':<34} {best['free']:>7.2f}s {rate['free']:>13.1f}")
    print(f"{'10-property json_schema':<34} {best['constrained']:>7.2f}s {rate['constrained']:>13.1f}")
    print(f"constrained / free: {ratio:.3f}x (target >= {TARGET_RATIO}x): {'met' if ratio >= TARGET_RATIO else 'NOT met'}")
    median = statistics.median(cached)
    print(f"schema compile: cold {cold_ms:.1f} ms; cached median {median:.4f} ms over {args.repeats} "
          f"(target <= {TARGET_CACHED_MS} ms): {'met' if median <= TARGET_CACHED_MS else 'NOT met'}")  # fmt: skip
    llm.llm_engine.close()


if __name__ == "__main__":
    main()
