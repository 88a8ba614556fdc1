"""values.yaml is documented key by key, and the chart README's table is generated from it."""

from __future__ import annotations

import json

import yaml

from tests.chart.values_doc import CHART, documented_keys, leaf_paths, render_readme

VALUES = (CHART / "values.yaml").read_text()


def test_every_settable_key_is_documented() -> None:
    documented = {d.key for d in documented_keys(VALUES)}
    undocumented = [
        leaf for leaf in leaf_paths(yaml.safe_load(VALUES))
        if not any(leaf == key or leaf.startswith(key + ".") for key in documented)
    ]
    assert not undocumented, f"add a `# --` comment above: {undocumented}"
    assert all(d.description.strip() for d in documented_keys(VALUES))


def _schema_paths(schema: dict, prefix: str = "") -> set[str]:
    """Dotted paths the schema describes, down to the free-form (non-closed) objects."""
    out = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}.{key}" if prefix else key
        out.add(path)
        if sub.get("additionalProperties") is False:
            out |= _schema_paths(sub, path)
    return out


def test_schema_describes_exactly_the_values() -> None:
    described = _schema_paths(json.loads((CHART / "values.schema.json").read_text()))
    closed = {p for p in described if any(d.startswith(p + ".") for d in described)}

    def value_paths(node: dict, prefix: str = "") -> set[str]:
        out = set()
        for key, sub in node.items():
            path = f"{prefix}.{key}" if prefix else key
            out.add(path)
            if path in closed:
                out |= value_paths(sub, path)
        return out

    assert value_paths(yaml.safe_load(VALUES)) == described


def test_readme_table_is_up_to_date() -> None:
    readme = (CHART / "README.md").read_text()
    assert render_readme(readme, VALUES) == readme, "stale: run `python -m tests.chart.values_doc`"


def test_parser_reads_nesting_defaults_and_continuations() -> None:
    text = (
        "# -- Top.\n"
        "top: 1\n"
        "group:\n"
        "  # -- First line\n"
        "  # second line.\n"
        "  inner:\n"
        "    a: [x]\n"
        "  # plain comment, not documentation\n"
        "  other: 2\n"
        "# -- Last.\n"
        "last: {}\n"
    )
    docs = {d.key: (d.default, d.description) for d in documented_keys(text)}
    assert docs == {
        "top": (1, "Top."),
        "group.inner": ({"a": ["x"]}, "First line second line."),
        "last": ({}, "Last."),
    }
    assert leaf_paths(yaml.safe_load(text)) == ["top", "group.inner.a", "group.other", "last"]
