"""Every benchmark command the docs quote next to a figure exists: the script is in bench/ and each flag it
is given is one that script (or a bench/ module it imports) declares. A renamed script or flag fails here,
not in front of a reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", ROOT / "examples" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]
# a script, then its arguments up to the end of the command: a backtick, a comment, a table cell, a line end
COMMAND = re.compile(r"bench/([a-z_0-9]+\.py)([^`#|\n]*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
# launchers whose flags are another program's (checked by that program when it runs)
FOREIGN_FLAGS = {"_vllm_bench_client.py": "vllm.benchmarks.serve"}


def _commands() -> list[tuple[str, str, str]]:
    found = set()
    for doc in DOCS:
        for match in COMMAND.finditer(doc.read_text()):
            found.add((doc.relative_to(ROOT).as_posix(), match.group(1), match.group(2).strip()))
    return sorted(found)


def _declared(script: Path) -> str:
    """The script's text and that of the bench/ modules it imports (flags shared between scripts)."""
    text = script.read_text()
    for module in set(re.findall(r"^\s*(?:from|import)\s+(?:bench\.)?(_?[a-z_0-9]+)", text, re.M)):
        helper = script.with_name(f"{module}.py")
        if helper.exists() and helper != script:
            text += helper.read_text()
    return text


def test_the_docs_quote_benchmark_commands() -> None:
    assert len(_commands()) > 50  # the pattern still finds them


@pytest.mark.parametrize(("doc", "script", "args"), _commands(), ids=lambda v: str(v)[:60])
def test_a_quoted_benchmark_command_runs_as_written(doc: str, script: str, args: str) -> None:
    path = ROOT / "bench" / script
    assert path.exists(), f"{doc} quotes bench/{script}, which does not exist"
    if script in FOREIGN_FLAGS:
        assert FOREIGN_FLAGS[script] in path.read_text()
        return
    declared = _declared(path)
    for flag in FLAG.findall(args):
        assert f'"{flag}"' in declared, f"{doc}: bench/{script} {args!r}: {flag} is not one of its flags"
