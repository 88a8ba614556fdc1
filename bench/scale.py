"""The operator at fleet scale: one `folio operator` process against kmock's emulator, N InferenceServices.

For each N (10, 100, 300 by default) in 10 namespaces, with the Job controller and kubelet played by the
driver (`tests.operator.harness.Fleet`: pre-pull Jobs complete, engine Deployments become ready) and a fake
router pod per service serving /metrics, it measures:

- the time from creating the services to all of them Ready;
- the operator's RSS (psutil) before the services and once they are Ready, and so its growth per service;
- the API requests the operator makes per service per minute when nothing changes (the emulator's own
  request log, the driver's requests left out);
- the reconcile latency of a spec change (p50/p99): a rollout field patched on ``--latency-samples``
  services one after the other, timed until ``status.observedGeneration`` shows it;
- a fleet bump (``--bump``, 100 by default, capped at N): a new revision for that many services at once,
  every tenth one's canary failing half its requests (by its router's metrics). The faulty ones must roll
  back within ``failureLimit x interval + 3 s`` of their canary taking traffic, the others promote, and
  each service's analysis keeps its cadence: no gap between two scrapes of a canary's router longer than
  two intervals (a sample delayed past its interval by the others).

    .venv/bin/python bench/scale.py                        # 10, 100, 300; the bump at 100
    .venv/bin/python bench/scale.py --counts 10 100 --json /tmp/scale.json

Targets (issue 44): idle API requests per service per minute <= 2; RSS growth <= 1 MiB per service;
spec-change reconcile p99 <= 1 s at 300 services.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import kmock
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests.operator.harness`, run from anywhere

from tests.operator.harness import (
    FLEET_FAILURE_LIMIT,
    FLEET_INTERVAL_S,
    Fleet,
    FleetService,
    ScaleApiServer,
    declare_resources,
    operator_processes,
)
from tests.support.wait import WaitTimeout, until

IDLE_TARGET = 2.0  # API requests per service per minute
RSS_TARGET_MIB = 1.0  # per service
P99_TARGET_S = 1.0  # at 300 services
ROLLBACK_SLACK_S = 3.0


@dataclass
class Bump:
    services: int
    faulty: int
    rolled_back: int = 0
    promoted: int = 0
    undecided: int = 0  # no verdict within the wait
    worst_rollback_s: float = 0.0  # from the canary taking traffic to it having none
    rollback_bound_s: float = FLEET_FAILURE_LIMIT * FLEET_INTERVAL_S + ROLLBACK_SLACK_S
    worst_gap_s: float = 0.0  # the longest time between two analyses (scrapes) of one canary
    gap_bound_s: float = 2 * FLEET_INTERVAL_S
    done_s: float = 0.0  # from the apply until every canary was decided

    @property
    def ok(self) -> bool:
        return (self.rolled_back == self.faulty and self.promoted == self.services - self.faulty
                and self.worst_rollback_s <= self.rollback_bound_s and self.worst_gap_s <= self.gap_bound_s)


@dataclass
class Row:
    services: int
    ready_s: float = 0.0
    rss_start_mib: float = 0.0
    rss_ready_mib: float = 0.0
    idle_requests_per_service_min: float = 0.0
    idle_window_s: float = 0.0
    idle_calls: dict[str, int] = field(default_factory=dict)  # what the operator called in the idle window
    latency_p50_s: float = 0.0
    latency_p99_s: float = 0.0
    latency_samples: list[float] = field(default_factory=list)
    bump: Bump | None = None

    @property
    def rss_per_service_mib(self) -> float:
        return (self.rss_ready_mib - self.rss_start_mib) / self.services


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


async def measure(count: int, namespaces: list[str], *, resync_s: float, idle_s: float, samples: int,
                  bump: int, tmp: Path, verbose: bool = False) -> Row:
    row = Row(count)
    async with ScaleApiServer() as server, kmock.Server(server):
        declare_resources(server)
        async with Fleet(server, namespaces, count) as fleet, operator_processes(server, tmp) as replicas:
            op = replicas.start("operator", "--peering", "", "--resync-seconds", f"{resync_s:g}",
                                *(["--verbose"] if verbose else []),
                                namespaces=tuple(namespaces))
            # the operator is up once it has opened its watches: the InferenceServices' and the children's
            await until(lambda: op.proc.poll() is None and fleet.watching(namespaces), 60, "the operator's watches",
                        interval=0.2)
            row.rss_start_mib = rss_mib(op.proc.pid)
            started = time.monotonic()
            await fleet.create()
            try:
                await until(lambda: fleet.ready() == count, 60 + count, f"{count} services Ready", interval=0.2)
            except WaitTimeout as exc:  # reported, not measured further: the rest needs every service Ready
                row.ready_s = float("nan")
                print(f"{exc}: {fleet.ready()} Ready", file=sys.stderr, flush=True)
                return row
            row.ready_s = time.monotonic() - started

            # idle: one resync for the last passes' writes to settle, then a window of nothing but the clocks
            await asyncio.sleep(resync_s + 2)
            before, t0 = fleet.operator_requests(), time.monotonic()
            await asyncio.sleep(idle_s)
            row.idle_window_s = time.monotonic() - t0
            calls = fleet.operator_calls(before)
            row.idle_requests_per_service_min = len(calls) / count / (row.idle_window_s / 60)
            row.idle_calls = dict(collections.Counter(calls).most_common())
            row.rss_ready_mib = rss_mib(op.proc.pid)

            for i, svc in enumerate(fleet.services[:: max(1, count // samples)][:samples]):
                generation = await fleet.patch_spec(svc, {"rollout": {"analysis": {"maxErrorRate": 0.05 + (i + 1) / 1000}}})
                t0 = time.monotonic()
                await until(lambda s=svc, g=generation: fleet.observed(s) >= g, 30, f"{svc.name} observed", interval=0.005)
                row.latency_samples.append(time.monotonic() - t0)
            ordered = sorted(row.latency_samples)
            row.latency_p50_s = statistics.median(ordered)
            row.latency_p99_s = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]

            if bump:
                row.bump = await fleet_bump(fleet, fleet.services[:bump])
            assert op.proc.poll() is None, f"the operator exited:\n{op.log()[-3000:]}"
    return row


async def fleet_bump(fleet: Fleet, services: list[FleetService]) -> Bump:
    """A new revision for ``services`` in one go; every tenth one faulty."""
    faulty = {svc.name for svc in services[::10]}
    result = Bump(len(services), len(faulty))
    applied = time.monotonic()
    await fleet.bump(services, faulty=faulty)
    # generous: a canary first waits for its pre-pull and a ready replica; what is measured is the rollback
    # from the canary taking traffic, and the gaps between its analyses
    try:
        await until(lambda: all(s.canary_done is not None for s in services), 60 + len(services),
                    "every canary decided", interval=0.2)
    except WaitTimeout as exc:
        print(f"{exc}: undecided {[s.name for s in services if s.canary_done is None]}", file=sys.stderr)
    result.done_s = time.monotonic() - applied
    current = fleet.isvcs()
    for svc in services:
        status = current[(svc.namespace, svc.name)].get("status") or {}
        traffic = {t["revision"]: t["weight"] for t in status.get("traffic") or []}
        if svc.canary_first is None or svc.canary_last is None or svc.canary_done is None:
            result.undecided += 1
            continue
        if svc.faulty and traffic == {svc.stable: 100} and status.get("failedRevisions"):
            result.rolled_back += 1
            result.worst_rollback_s = max(result.worst_rollback_s, svc.canary_done - svc.canary_first)
        elif not svc.faulty and status.get("stableRevision") != svc.stable and len(traffic) == 1:
            result.promoted += 1
        scrapes = [t for t in svc.scrapes if svc.canary_first <= t <= svc.canary_last]
        gaps = [b - a for a, b in itertools.pairwise(scrapes)]
        # the first scrape after the canary takes traffic is due an interval after it
        gaps.append((scrapes[0] if scrapes else svc.canary_last) - svc.canary_first)
        result.worst_gap_s = max(result.worst_gap_s, *gaps)
    return result


def verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def table(rows: list[Row]) -> str:
    # RSS / service in one row includes what the first passes load once (modules, caches): the target is
    # on the growth from one count to the next, below the rows
    lines = ["| services | to all Ready | RSS start → Ready (MiB) | RSS / service | idle API req / service / min "
             "| spec change p50 / p99 |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r.services} | {r.ready_s:.1f} s | {r.rss_start_mib:.0f} → {r.rss_ready_mib:.0f} "
            f"| {r.rss_per_service_mib * 1024:.0f} KiB "
            f"| {r.idle_requests_per_service_min:.2f} ({verdict(r.idle_requests_per_service_min <= IDLE_TARGET)}) "
            f"| {r.latency_p50_s * 1000:.0f} / {r.latency_p99_s * 1000:.0f} ms "
            f"({verdict(r.latency_p99_s <= P99_TARGET_S) if r.services >= 300 else 'target at 300'}) |")
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        growth = (last.rss_ready_mib - first.rss_ready_mib) / (last.services - first.services)  # nan: not Ready
        lines.append(f"\nRSS growth {first.services} → {last.services} services: {growth * 1024:.0f} KiB per service "
                     f"(target ≤ {RSS_TARGET_MIB:g} MiB: {verdict(growth <= RSS_TARGET_MIB)})")
    for r in rows:
        if r.bump is not None:
            b = r.bump
            lines.append(
                f"\nFleet bump of {b.services} at {r.services} services ({b.faulty} faulty): {b.rolled_back}/{b.faulty} "
                f"rolled back (worst {b.worst_rollback_s:.1f} s, bound {b.rollback_bound_s:g} s), "
                f"{b.promoted}/{b.services - b.faulty} promoted, {b.undecided} undecided, all done in {b.done_s:.1f} s; "
                f"longest gap between one canary's analyses {b.worst_gap_s:.1f} s (bound {b.gap_bound_s:g} s, "
                f"interval {FLEET_INTERVAL_S:g} s): {verdict(b.ok)}")
    return "\n".join(lines)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[10, 100, 300])
    parser.add_argument("--namespaces", type=int, default=10)
    parser.add_argument("--resync-seconds", type=float, default=10.0, help="the operator's (its default)")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="the idle window")
    parser.add_argument("--latency-samples", type=int, default=50)
    parser.add_argument("--bump", type=int, default=100, help="services bumped at once (at the count >= it)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the operator's log here (<dir>/<count>/)")
    parser.add_argument("--verbose", action="store_true", help="the operator logs at DEBUG")
    args = parser.parse_args()
    namespaces = [f"team-{i}" for i in range(args.namespaces)]
    # the bump runs once: at the first count that has as many services (else at the largest)
    bump_at = next((c for c in sorted(args.counts) if c >= args.bump), max(args.counts))
    rows = []
    for count in args.counts:
        with tempfile.TemporaryDirectory(prefix="folio-scale-") as tmp:
            logs = args.log_dir / str(count) if args.log_dir else Path(tmp)
            logs.mkdir(parents=True, exist_ok=True)
            row = await measure(count, namespaces, resync_s=args.resync_seconds, idle_s=args.idle_seconds,
                                samples=args.latency_samples, bump=min(args.bump, count) if count == bump_at else 0,
                                tmp=logs, verbose=args.verbose)
        rows.append(row)
        print(table([row]), f"\nidle calls in {row.idle_window_s:.0f} s: {row.idle_calls}", flush=True)
    print("\n" + table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
