"""The status table `folio status` and `folio up` print, for local and cluster services alike.

Every cell is a `Text`: names, engine args, reasons and messages (some from the API server) are printed as
they are, never read as rich markup."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from folio.operator.spec import InferenceServiceStatus

_CONDITION_STYLE = {"True": "green", "False": "red", "Unknown": "yellow"}
_DEGRADED_STYLE = {"True": "red", "False": "green", "Unknown": "yellow"}


def status_table(
    name: str, status: InferenceServiceStatus, processes: dict[str, dict[str, Any]] | None = None
) -> Group:
    """Revisions with their role, traffic and replicas, then conditions and the last analysis."""
    weights = {t.revision: t.weight for t in status.traffic}
    title = Text.assemble("InferenceService ", (name, "bold"), f" — {status.phase or 'Pending'}")
    revs = Table(title=title, title_justify="left", expand=False)
    for col in ("revision", "role", "traffic", "ready", "restarts", "engine args"):
        revs.add_column(col, justify="right" if col in ("traffic", "ready", "restarts") else "left")
    for rev in status.revisions:
        proc = (processes or {}).get(rev.name)
        ready = f"{proc['ready']}/{proc['replicas']}" if proc else str(rev.ready_replicas)
        revs.add_row(*map(Text, (
            rev.name,
            rev.role if rev.weights_ready else f"{rev.role} (pulling weights)",
            f"{weights.get(rev.name, 0)}%",
            ready,
            str(proc["restarts"]) if proc else "-",
            "\n".join(f"{k}={v}" for k, v in sorted(rev.args.items())) or "-",
        )))  # fmt: skip
    parts: list[Any] = [revs]
    for source in dict.fromkeys(rev.model.source for rev in status.revisions):
        parts.append(Text(f"model: {source}", style="dim"))

    if status.canary is not None and status.canary_revision:
        c = status.canary
        line = f"canary {status.canary_revision}: step {c.step + 1}, {c.weight}% of traffic"
        if c.last_analysis is not None:
            a = c.last_analysis
            line += f"; last analysis {a.verdict}: {a.requests} requests, error rate {a.error_rate:.1%}" + (
                f", p99 {a.latency_p99_ms:.0f} ms" if a.latency_p99_ms is not None else ""
            )
        parts.append(Text(line))

    if status.adapters:
        parts.append(adapters_table(status))

    if status.autoscaling is not None:
        auto = status.autoscaling
        parts.append(Text(f"autoscaling ({auto.metric}): {auto.current_replicas} ready, {auto.desired_replicas} desired; "
                          f"{auto.reason}" if not auto.keda else f"autoscaling: {auto.reason}"))

    conds = Table(show_header=True, expand=False, box=None, pad_edge=False)
    for col in ("condition", "status", "reason", "message"):
        conds.add_column(col)
    for c in status.conditions:
        styles = _DEGRADED_STYLE if c.type == "Degraded" else _CONDITION_STYLE
        conds.add_row(Text(c.type), Text(c.status, style=styles.get(c.status, "")), Text(c.reason), Text(c.message))
    if status.conditions:
        parts.append(conds)

    if status.failed_revisions:
        failed = Table(title="failed revisions", title_justify="left", box=None, expand=False)
        for col in ("revision", "reason", "at", "message"):
            failed.add_column(col)
        for f in status.failed_revisions:
            failed.add_row(Text(f.revision), Text(f.reason), Text(f.at), Text(f.message))
        parts.append(failed)
    return Group(*parts)


def adapters_table(status: InferenceServiceStatus) -> Table:
    """Each adapter's revisions: role, traffic, replicas holding it; then its phase and what it waits for."""
    table = Table(title="adapters", title_justify="left", expand=False)
    for col in ("adapter", "revision", "role", "traffic", "loaded on", "state"):
        table.add_column(col, justify="right" if col in ("traffic", "loaded on") else "left")
    for adapter in status.adapters:
        weights = {t.revision: t.weight for t in adapter.traffic}
        progressing, degraded = adapter.condition("Progressing"), adapter.condition("Degraded")
        state = degraded if degraded is not None and degraded.status == "True" else progressing
        note = f"{adapter.phase or 'Pending'}" + (f": {state.message}" if state is not None and state.status == "True"
                                                  else "")
        rows = adapter.revisions or []
        for i, rev in enumerate(rows):
            table.add_row(*map(Text, (
                adapter.name if i == 0 else "",
                rev.name,
                rev.role if rev.weights_ready or rev.role == "Failed" else f"{rev.role} (pulling)",
                f"{weights.get(rev.name, 0)}%",
                str(rev.ready_replicas),
                note if i == 0 else "",
            )))  # fmt: skip
        if not rows:
            table.add_row(*map(Text, (adapter.name, "-", "-", "0%", "0", note)))
        for f in adapter.failed_revisions[-1:]:
            table.add_row(*map(Text, ("", f.revision, "Failed", "0%", "0", f"{f.reason}: {f.message}")))
    return table
