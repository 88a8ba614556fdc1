"""`folio status NAME --parity`: the parity gate's report, as a table (the same for local and cluster)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from folio.operator.spec import InferenceServiceStatus, ParityReport


def latest_report(status: InferenceServiceStatus) -> ParityReport | None:
    """The canary's report while it has one, else that of the most recent revision the gate failed."""
    if status.canary is not None and status.canary.parity is not None:
        return status.canary.parity
    return next((f.parity for f in reversed(status.failed_revisions) if f.parity is not None), None)


def parity_table(name: str, status: InferenceServiceStatus) -> Group | Text:
    report = latest_report(status)
    if report is None:
        return Text(f"{name}: no parity report (spec.rollout.parity unset, or no canary has been gated yet)")
    colour = {"Pass": "green", "Fail": "red", "Error": "yellow"}[report.verdict]
    # names, messages and prompts are the user's text: rich Text, never markup
    head = Table(title=Text(f"{name}: parity of canary {report.revision} vs stable {report.stable_revision}"),
                 show_header=False, title_justify="left")
    head.add_row("verdict", Text(report.verdict, style=f"bold {colour}"))
    if report.verdict != "Error":
        head.add_row("prompts", str(report.prompts))
        head.add_row("mean cosine", f"{report.mean_cosine:.6f}")
        head.add_row("lowest cosine", f"{report.min_cosine:.6f}")
        head.add_row("token match", f"{report.token_match:.1%}")
        head.add_row("tokenized differently", str(report.prompt_token_mismatches))
    if report.message:
        head.add_row("message", Text(report.message))
    head.add_row("at", f"{report.at or '-'} ({report.seconds or 0:.1f}s)")
    if not report.worst:
        return Group(head)
    worst = Table(title="worst prompts", title_justify="left")
    for column in ("#", "prompt", "cosine", "diverges at", "stable", "canary"):
        worst.add_column(column)
    for w in report.worst:
        where = "-" if w.first_divergence is None else f"token {w.first_divergence}"
        if w.prompt_tokens_differ:
            where += " (prompt tokens differ)"
        worst.add_row(str(w.index), Text(w.prompt), f"{w.cosine:.6f}", Text(where), Text(repr(w.stable)),
                      Text(repr(w.canary)))
    return Group(head, worst)
