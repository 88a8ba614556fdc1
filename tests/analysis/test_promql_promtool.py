"""The analysis' PromQL (`promql_queries`) evaluated by Prometheus itself (`promtool test rules`) over series
shaped as Folio's routers export them: the base revisions' figures count every request of a revision, adapters'
included; an adapter's figures count that adapter's revisions' requests alone, across base revisions."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from folio.operator import metric_names as m
from folio.operator.analysis.prometheus import promql_queries
from tests.support.tools import find_tool

# one router's counters, a sample a minute (promtool's series notation: start+step x count)
BASE = {m.ISVC: "chat", m.ADAPTER: "", m.ADAPTER_REVISION: ""}


def series(revision: str, code: str, per_minute: int, **labels: str) -> dict[str, str]:
    tags = {**BASE, m.REVISION: revision, m.CODE: code, **labels}
    selector = ",".join(f'{k}="{v}"' for k, v in sorted(tags.items()))
    return {"series": f"{m.REQUESTS}{{{selector}}}", "values": f"0+{per_minute}x10"}


INPUT = [
    series("b1", "200", 60),  # the base model's own requests on revision b1
    series("b1", "500", 6),
    series("b1", "200", 30, adapter="sql", adapter_revision="s1"),  # sql's stable revision
    series("b1", "500", 3, adapter="sql", adapter_revision="s2"),  # sql's canary: half its requests fail
    series("b1", "200", 3, adapter="sql", adapter_revision="s2"),
    series("b2", "200", 9, adapter="sql", adapter_revision="s2"),  # ... on a second base revision too
    series("b1", "200", 12, adapter="chat-helper", adapter_revision="s2"),  # another adapter: not sql's
]


def expect(expr: str, value: float) -> dict[str, object]:
    """The query at 5m: a window of one minute holds each series' per-minute increase."""
    return {"expr": expr, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": value}]}


def test_base_and_adapter_figures_are_what_prometheus_computes(tmp_path: Path) -> None:
    base = promql_queries("chat", "b1", None, "1m")
    sql = promql_queries("chat", "s2", "s1", "1m", adapter="sql")
    tests = [
        expect(base["requests"], 60 + 6 + 30 + 3 + 3 + 12),  # every request b1 answered
        expect(base["errors"], 6 + 3),
        expect(sql["requests"], 3 + 3 + 9),  # sql's canary across both base revisions, not chat-helper's
        expect(sql["errors"], 3),
    ]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": []}))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({
        "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": INPUT, "promql_expr_test": tests}],
    }, sort_keys=False))  # fmt: skip
    proc = subprocess.run([find_tool("promtool"), "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("adapter", [None, "sql"])
def test_every_query_names_the_service_and_its_revisions(adapter: str | None) -> None:
    queries = promql_queries("chat", "c1", "s1", "30s", adapter)
    key = m.ADAPTER_REVISION if adapter else m.REVISION
    assert all('isvc="chat"' in q and "[30s]" in q and f'{key}="' in q for q in queries.values())
    assert all((f'{m.ADAPTER}="sql"' in q) == (adapter == "sql") for q in queries.values())
