"""The parts of folio.operator import each other one way: no cycle between its subpackages (analysis,
autoscaling, controller, k8s, local, parity, rollout, router, serving, testing, …) and its top-level
modules (spec, crd, prepull, cli, yaml_load, …).

Every import counts, at module level, under ``if TYPE_CHECKING`` and inside a function alike: a
function-local import that dodges a cycle at import time is still a cycle in the design. So does a
module loaded by name: one that calls ``importlib.import_module`` depends on every ``folio.operator.…``
module name it spells (the CLI's command table). The graph is built from the source (AST), so the test
imports nothing it checks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

OPERATOR = Path(__file__).resolve().parents[1] / "operator"
PREFIX = ("folio", "operator")

# Edges (importer, imported) between parts known to close a cycle that someone is removing: each is left
# out of the graph, and each must still exist (a stale entry fails too), so the list empties as they go.
KNOWN_BACK_EDGES: dict[tuple[str, str], str] = {}

Graph = dict[str, dict[str, list[str]]]  # importer part -> imported part -> where ("file:line -> module")


def part_of(module: str) -> str | None:
    """The part of folio.operator a dotted module name belongs to (``folio.operator.rollout.canary``:
    ``rollout``), None outside folio.operator."""
    parts = module.split(".")
    if tuple(parts[:2]) != PREFIX or len(parts) < 3:
        return None
    return parts[2]


def imported(node: ast.Import | ast.ImportFrom, package: list[str]) -> Iterator[str]:
    """The dotted names an import statement in a module of ``package`` (its parts below folio.operator)
    refers to; for ``from folio.operator import x`` that is folio.operator.x."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    if node.level:
        base = [*PREFIX, *package][: len(PREFIX) + len(package) - (node.level - 1)]
        module = ".".join([*base, *([node.module] if node.module else [])])
    else:
        module = node.module or ""
    if tuple(module.split(".")) == PREFIX:
        yield from (f"{module}.{alias.name}" for alias in node.names)
    else:
        yield module


def loads_by_name(tree: ast.AST) -> bool:
    """Whether a module calls ``importlib.import_module``: then the module names it spells are imports too."""
    return any(
        isinstance(n, ast.Call) and "import_module" in (getattr(n.func, "attr", None), getattr(n.func, "id", None))
        for n in ast.walk(tree)
    )


def import_graph(root: Path = OPERATOR) -> Graph:
    graph: Graph = {}
    for source in sorted(root.rglob("*.py")):
        rel = source.relative_to(root)
        parts = list(rel.with_suffix("").parts)
        package = parts[:-1]  # a module's package; an __init__'s own
        here = parts[0]
        tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
        by_name = loads_by_name(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                modules = list(imported(node, package))
            elif by_name and isinstance(node, ast.Constant) and isinstance(node.value, str):
                modules = [node.value]  # a module it may load by name
            else:
                continue
            for module in modules:
                there = part_of(module)
                if there is not None and there != here:
                    graph.setdefault(here, {}).setdefault(there, []).append(f"operator/{rel}:{node.lineno} -> {module}")
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one part (Tarjan's), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(graph: Graph, component: list[str]) -> str:
    lines = [" <-> ".join(component)]
    for a in component:
        for b in component:
            for where in graph.get(a, {}).get(b, []):
                lines.append(f"    {a} -> {b}: {where}")
    return "\n".join(lines)


def test_no_import_cycle_between_the_parts_of_folio_operator() -> None:
    graph = import_graph()
    stale = [edge for edge in KNOWN_BACK_EDGES if edge[1] not in graph.get(edge[0], {})]
    for a, b in KNOWN_BACK_EDGES:
        graph.get(a, {}).pop(b, None)
    found = cycles(graph)
    assert not found, "import cycles between parts of folio.operator:\n" + "\n".join(describe(graph, c) for c in found)
    assert not stale, f"no longer imported, drop from KNOWN_BACK_EDGES: {stale}"


def test_the_parity_gate_depends_on_the_spec_alone() -> None:
    # the rollout state machine calls the gate, never the reverse
    assert set(import_graph().get("parity", {})) <= {"spec"}


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "__init__.py").write_text("")
    (tmp_path / "a" / "m.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import n\n"
        "if TYPE_CHECKING:\n    from folio.operator.b import x\n"
        "def f():\n    from folio.operator import c\n    import folio.operator.d.y\n"
        "from ..e import z\n"
    )
    (tmp_path / "b.py").write_text("from folio.operator.a.m import f\n")
    (tmp_path / "c.py").write_text("import importlib\nTABLE = {'x': 'folio.operator.f.cli'}\n"
                                   "def load(name):\n    return importlib.import_module(TABLE[name])\n")
    graph = import_graph(tmp_path)
    assert set(graph["a"]) == {"b", "c", "d", "e"}
    assert set(graph["c"]) == {"f"}
    assert cycles(graph) == [["a", "b"]]
