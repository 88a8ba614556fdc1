"""The chart README's values table, generated from the `# --` comments in values.yaml.

Each documented key in values.yaml is preceded by a comment block starting with `# -- ` (the
helm-docs convention); continuation lines are plain `# ` comments. A documented key may be a
mapping (e.g. `resources`), which is then shown whole. `python -m tests.chart.values_doc` rewrites
the table between the README's markers; tests/chart/test_values_doc.py fails when it is stale.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "folio"
START, END = "<!-- values:start -->", "<!-- values:end -->"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):(?P<rest>.*)$")


@dataclass(frozen=True)
class Documented:
    key: str  # dotted path
    default: Any
    description: str


def documented_keys(text: str) -> list[Documented]:
    values = yaml.safe_load(text)
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    pending: list[str] | None = None  # the comment block just above the current line
    found: list[Documented] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# -- "):
            pending = [stripped[5:]]
            continue
        if stripped.startswith("#") and pending is not None:
            pending.append(stripped.lstrip("# ").rstrip())
            continue
        match = _KEY.match(line)
        if not match:
            if stripped:  # list items and other content end a comment block
                pending = None
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [k for _, k in stack] + [match["key"]]
        if pending is not None:
            found.append(Documented(".".join(path), _lookup(values, path), " ".join(pending)))
            pending = None
        stack.append((indent, match["key"]))
    return found


def leaf_paths(values: Any, prefix: str = "") -> list[str]:
    """Every key whose value is not a non-empty mapping: what a user can set."""
    if isinstance(values, dict) and values:
        return [p for k, v in values.items() for p in leaf_paths(v, f"{prefix}.{k}" if prefix else k)]
    return [prefix]


def _lookup(values: Any, path: list[str]) -> Any:
    for key in path:
        values = values[key]
    return values


def table(docs: list[Documented]) -> str:
    rows = ["| Key | Default | Description |", "| --- | --- | --- |"]
    for doc in docs:
        default = _cell(json.dumps(doc.default, separators=(", ", ": ")))
        rows.append(f"| `{doc.key}` | `{default}` | {_cell(doc.description)} |")
    return "\n".join(rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_readme(readme: str, values_text: str) -> str:
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table(documented_keys(values_text))}\n{END}{tail}"


def main() -> int:
    readme = CHART / "README.md"
    readme.write_text(render_readme(readme.read_text(), (CHART / "values.yaml").read_text()))
    print(f"wrote {readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
