"""Is the strict editable install's link tree (see setup.py and the Makefile's `link`) up to date?

It links the files that existed when it was made: a module added since is missing from `folio.*`, and one
removed since is a dangling link. `make test` re-links by itself; a bare `pytest` is stopped with a clear
message instead of failing later on a puzzling import error.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_FOLDERS = ("operator", "engine", "kernels")


def link_tree() -> Path | None:
    """The `folio/` folder of links made by a strict editable install; None for any other kind of install."""
    spec = importlib.util.find_spec("folio.operator.cli")
    if spec is None or spec.origin is None or not Path(spec.origin).is_symlink():
        return None
    return Path(spec.origin).parents[1]


def stale_links(tree: Path, sources: list[Path]) -> list[str]:
    """What the link tree misses (source files without a link) or still has (links to removed files)."""
    links = [p for p in tree.rglob("*") if p.is_symlink()]
    linked = {p.resolve() for p in links}
    missing = [f"not linked: {s}" for s in sources if s.resolve() not in linked]
    dangling = [f"removed: {p.readlink()}" for p in links if not p.exists()]
    return sorted(missing + dangling)


def python_sources(root: Path = ROOT) -> list[Path]:
    return sorted(p for folder in PACKAGE_FOLDERS for p in (root / folder).rglob("*.py"))
