"""The shell blocks of the docs, read and run as a reader would: one terminal session per document.

A shell block is a fenced block tagged ``bash``, ``sh``, ``shell`` or ``console``, or an untagged one with
``$ `` prompts or that starts with a command (`COMMAND`); a ``python`` block runs as a script too. In a
block with prompts, each ``$ `` line is a command (``\\`` continues it) and the lines after it are its
output as the doc quotes it; in one without, every line that is not a comment is a command, and the block
runs as one script (``set -e``; so ``kill %1`` finds the job an ``&`` started). A block may be preceded by
a directive, an HTML comment that renders as nothing:

    <!-- docs-test: skip: REASON -->   not run here (a GPU, a cluster, a peer); the reason is required
    <!-- docs-test: slow -->           run, but long: the slow test runs the document
    <!-- docs-test: background -->     each command keeps running (a server) once its quoted output appeared
    <!-- docs-test: poll=SECONDS -->    a command whose quoted output is not all there yet is run again,
                                        as a reader re-runs `folio status`, until it is (at most SECONDS)

Quoted output matches a line of what the command printed when, after both are reduced by `_normal`
(box-drawing characters dropped, runs of spaces made one), it matches the quoted line read as a pattern:
``…`` stands for anything, a clock time (``13:58:24``) for any clock time. The lines must appear in order.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "examples" / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "bench" / "README.md", ROOT / "charts" / "folio" / "README.md"]  # fmt: skip
SHELLS = {"bash", "sh", "shell", "console"}
# an untagged block that starts like this is commands (bench/README.md's, mostly)
COMMAND = re.compile(r"^(\.venv/bin/|folio |make |kubectl |helm |docker |curl |bash |e2e/|taskset |python )")
DIRECTIVE = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->$")
CLOCK = re.compile(r"\b\d\d:\d\d:\d\d\b")
BOX = re.compile(r"[\u2500-\u257f]")
COMMAND_TIMEOUT = 180.0  # one command (a background one: until its quoted output appeared)


@dataclass
class Command:
    text: str  # as bash reads it, continuations joined
    output: list[str] = field(default_factory=list)  # the lines the doc quotes under it


@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    commands: list[Command]
    script: str | None = None  # an unprompted block's text, run whole
    skip: str | None = None  # why it is not run here
    slow: bool = False
    background: bool = False
    poll: float = 0.0

    @property
    def where(self) -> str:
        doc = self.doc.relative_to(ROOT) if self.doc.is_relative_to(ROOT) else self.doc
        return f"{doc}:{self.line}"


# ------------------------------------------------------------------------------------------ reading


def blocks(doc: Path) -> list[Block]:
    """Every shell block of ``doc``, with the directive above it."""
    found, lines = [], doc.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        body, lang = lines[i + 1 : end], fence.group(1)
        prompted = any(line.startswith("$ ") for line in body)
        first = next((line for line in body if line.strip()), "")
        if lang in SHELLS or (not lang and (prompted or COMMAND.match(first))):
            found.append(_block(doc, i + 1, body, prompted, _directive(lines, i)))
        elif lang == "python":  # run as the interpreter of `make install` runs a script
            script = ["python - <<'PYTHON'", *body, "PYTHON"]
            found.append(_block(doc, i + 1, script, False, _directive(lines, i)))
        i = end + 1
    return found


def _directive(lines: list[str], fence: int) -> str:
    above = next((lines[j].strip() for j in range(fence - 1, -1, -1) if lines[j].strip()), "")
    match = DIRECTIVE.match(above)
    return match.group(1) if match else ""


def _block(doc: Path, line: int, body: list[str], prompted: bool, directive: str) -> Block:
    block = Block(doc, line, _commands(body, prompted), script=None if prompted else "\n".join(body))
    if directive.startswith("skip:"):
        block.skip = directive.removeprefix("skip:").strip()
        if not block.skip:
            raise ValueError(f"{block.where}: a skipped block says why (docs-test: skip: REASON)")
        return block
    for word in directive.split():
        if word in ("slow", "background"):
            setattr(block, word, True)
        elif re.fullmatch(r"poll=\d+", word):
            block.poll = float(word.removeprefix("poll="))
        else:
            raise ValueError(f"{block.where}: unknown docs-test directive {word!r}")
    return block


def _commands(body: list[str], prompted: bool) -> list[Command]:
    commands: list[Command] = []
    continued = False  # the last command's line ended with a backslash
    for raw in body:
        line = raw.rstrip()
        if continued:
            commands[-1].text = f"{commands[-1].text[:-1]}{line.lstrip()}"
        elif prompted and not line.startswith("$ "):
            if commands and line.strip():
                commands[-1].output.append(line.strip())
            continue
        else:
            text = line.removeprefix("$ ") if prompted else line
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            commands.append(Command(text))
        continued = commands[-1].text.endswith("\\")
    return commands


# ------------------------------------------------------------------------------------------ matching


def _normal(line: str) -> str:
    return " ".join(BOX.sub(" ", line).split())


def _pattern(quoted: str) -> re.Pattern[str]:
    parts = []
    for piece in _normal(quoted).split("…"):
        parts.append(CLOCK.sub(r"\\d\\d:\\d\\d:\\d\\d", re.escape(piece)).replace(r"\ ", " "))
    return re.compile(".*".join(parts).replace(" ", r"\s*"))


def missing(quoted: list[str], printed: str) -> list[str]:
    """The quoted lines not found, in order, among the printed ones (empty: everything is there)."""
    lines = [_normal(line) for line in printed.splitlines()]
    at = 0
    for n, line in enumerate(quoted):
        if not line.replace("…", "").strip():
            continue
        pattern = _pattern(line)
        hit = next((i for i in range(at, len(lines)) if pattern.search(lines[i])), None)
        if hit is None:
            return quoted[n:]
        at = hit + 1
    return []


# ------------------------------------------------------------------------------------------ running


class Session:
    """One reader's terminal: a folder that looks like the repository (its top-level entries linked),
    ``folio`` on PATH, and every process group it started stopped when it closes."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="folio-docs-")
        self.cwd = Path(self._tmp.name)
        for entry in ROOT.iterdir():
            if entry.name not in (".git", ".folio"):
                (self.cwd / entry.name).symlink_to(entry)
        venv = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv"))
        path = os.pathsep.join([str(venv / "bin"), str(venv / "tools" / "bin"), os.environ["PATH"]])  # make tools
        self.env = {**os.environ, "PATH": path, "COLUMNS": "100",
                    "NO_COLOR": "1", "TERM": "dumb"}  # fmt: skip
        self._groups: list[subprocess.Popen[bytes]] = []

    def start(self, command: str, log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(["bash", "-c", command], cwd=self.cwd, env=self.env, stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        self._groups.append(proc)
        return proc

    def run(self, block: Block) -> None:
        """Run ``block``'s commands; raise AssertionError naming the command and what went wrong."""
        commands = block.commands if block.script is None else [Command(block.script)]
        for n, command in enumerate(commands):
            log = self.cwd / f".docs-{block.line}-{n}.log"
            deadline = time.monotonic() + max(block.poll, COMMAND_TIMEOUT)
            while True:
                log.unlink(missing_ok=True)
                proc = self.start(f"set -e\n{command.text}" if block.script else command.text, log)
                if block.background:
                    self._await_output(block, command, proc, log, deadline)
                    break
                try:
                    code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise AssertionError(f"{block.where}: `{command.text}` still runs after its time") from None
                printed = log.read_text(errors="replace")
                assert code == 0, f"{block.where}: `{command.text}` exited with {code}:\n{printed[-3000:]}"
                lost = missing(command.output, printed)
                if not lost:
                    break
                if not block.poll or time.monotonic() > deadline:
                    raise AssertionError(f"{block.where}: `{command.text}` did not print {lost[0]!r}; it printed:\n"
                                         f"{printed[-3000:]}")
                time.sleep(2.0)

    def _await_output(self, block: Block, command: Command, proc: subprocess.Popen[bytes], log: Path,
                      deadline: float) -> None:  # fmt: skip
        while missing(command.output, printed := log.read_text(errors="replace")):
            if proc.poll() is not None or time.monotonic() > deadline:
                state = "exited" if proc.poll() is not None else "is running"
                raise AssertionError(f"{block.where}: `{command.text}` {state} without printing "
                                     f"{missing(command.output, printed)[0]!r}; it printed:\n{printed[-3000:]}")
            time.sleep(0.5)

    def close(self) -> None:
        """SIGINT to every process group still running (as Ctrl-C would), then SIGKILL to what is left; each
        is reaped before this returns. (A group whose leader is reaped already is not signalled: its id may
        be another process's by now.)"""
        running = [proc for proc in reversed(self._groups) if proc.poll() is None]
        for proc in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGINT)
        for proc in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)  # a server drains on SIGINT; what is left after that is killed
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the group's other processes too, if the leader is gone
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self._tmp.cleanup()


def all_blocks() -> Iterator[Block]:
    for doc in DOCS:
        yield from blocks(doc)
