"""Whole engine decode steps, timed in this process (bench/decode_gemm.py, bench/cpu_graphs.py)."""

from __future__ import annotations

import time

from folio.engine import LLM, SamplingParams
from folio.engine.cpu_graphs import RECORD_AFTER


def decode_step_ms(llm: LLM, sequences: int, steps: int = 40) -> float:
    """The median of ``steps`` decode steps with ``sequences`` running (~200-token prompts, sampled at
    temperature 1 as a served request is, so the LM head and the sampler count)."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=1.0, max_tokens=steps + 8, ignore_eos=True, seed=0)
    for i in range(sequences):
        engine.add_request(f"r{i}", " ".join(["the river and the mountain"] * 40) + f" {i}", params)
    while any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running) or \
            engine.scheduler.waiting:  # fmt: skip
        engine.step()  # the prompts' prefill
    for _ in range(RECORD_AFTER + 1):  # the size's eager steps, then its CPU step graph's recording
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    for i in range(sequences):
        engine.abort_request(f"r{i}")
    return sorted(times)[len(times) // 2] * 1e3
