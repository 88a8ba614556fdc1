"""The docs' shell blocks run as written: each document's blocks in order, in one session, as a reader would
type them on this machine (no GPU, no cluster), and what the doc quotes of their output appears. A block that
cannot run here says why (``<!-- docs-test: skip: REASON -->``); a benchmark's command is not run (its figures
are one run's), its script and flags are checked by tests/test_doc_commands.py instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.shell_blocks import ROOT, Block, Session, all_blocks, blocks, missing

BENCHMARK = re.compile(r"^(taskset -c [\d,]+ )?(\.venv/bin/python|bash) bench/\S+")


def _benchmark(block: Block) -> bool:
    return all(BENCHMARK.match(c.text) for c in block.commands)


def _runs(block: Block) -> bool:
    return block.skip is None and not _benchmark(block)


def _docs() -> list[pytest.param]:
    params = []
    for doc in sorted({b.doc for b in all_blocks() if _runs(b)}):
        slow = any(b.slow for b in blocks(doc) if _runs(b))
        params.append(pytest.param(doc, id=str(doc.relative_to(ROOT)), marks=[pytest.mark.slow] if slow else []))
    return params


def test_every_shell_block_runs_or_says_why_not() -> None:
    found = list(all_blocks())
    assert len(found) > 50 and all(b.commands for b in found), [b.where for b in found if not b.commands]
    running = [b.where for b in found if _runs(b)]
    assert {"README.md", "examples/README.md"} <= {where.split(":")[0] for where in running}
    for block in found:
        assert block.skip is None or len(block.skip) > 10, f"{block.where}: say why it does not run here"
        assert not (_benchmark(block) and block.skip), f"{block.where}: a benchmark is never run here anyway"


@pytest.mark.parametrize("doc", _docs())
def test_a_document_runs_as_written(doc: Path) -> None:
    session = Session()
    try:
        for block in blocks(doc):
            if _runs(block):
                session.run(block)
    finally:
        session.close()


# ------------------------------------------------------------------------------------------ the reader itself


def _write(tmp_path: Path, text: str) -> Path:
    doc = tmp_path / "doc.md"
    doc.write_text(text)
    return doc


def test_blocks_commands_output_and_directives(tmp_path: Path) -> None:
    doc = _write(tmp_path, """
```bash
make demo   # a comment
curl -s localhost:8000 \\
  -d '{}'
```

<!-- docs-test: skip: needs a cluster to apply to -->
```
$ kubectl get fisvc
NAME   READY
```

<!-- docs-test: background slow poll=30 -->
```console
$ folio up x.yaml
13:58:24 serving
```

```
(new) ──▶ Promoted
```
""")
    plain, skipped, served = blocks(doc)
    assert [c.text for c in plain.commands] == ["make demo   # a comment", "curl -s localhost:8000 -d '{}'"]
    assert skipped.skip == "needs a cluster to apply to" and skipped.commands[0].output == ["NAME   READY"]
    assert (served.background, served.slow, served.poll, served.line) == (True, True, 30.0, 15)
    with pytest.raises(ValueError, match="unknown docs-test directive 'sometimes'"):
        blocks(_write(tmp_path, "<!-- docs-test: sometimes -->\n```bash\nls\n```\n"))
    with pytest.raises(ValueError, match="says why"):
        blocks(_write(tmp_path, "<!-- docs-test: skip: -->\n```bash\nls\n```\n"))


def test_quoted_output_is_matched_in_order_with_elisions_and_clock_times() -> None:
    printed = "19:02:11 router on http://127.0.0.1:8080 (state in /tmp/x/.folio)\n┃ revision ┃ role  ┃\n│ 1a2b │ Stable │\ndone"
    assert missing(["13:58:24 router on http://127.0.0.1:8080 (state in …/.folio)", "│ 1a2b   │ Stable │", "…",
                    "done"], printed) == []  # fmt: skip
    assert missing(["done", "│ 1a2b │ Stable │"], printed) == ["│ 1a2b │ Stable │"]  # order matters
    assert missing(["router on http://127.0.0.1:9090"], printed) == ["router on http://127.0.0.1:9090"]


def test_a_command_that_fails_or_prints_something_else_fails_the_document(tmp_path: Path) -> None:
    session = Session()
    try:
        doc = _write(tmp_path, "```console\n$ echo hello\nhello\n$ echo bye\nfarewell\n```\n\n```bash\nexit 3\n```\n")
        printing, failing = blocks(doc)
        with pytest.raises(AssertionError, match="`echo bye` did not print 'farewell'"):
            session.run(printing)
        with pytest.raises(AssertionError, match="`exit 3` exited with 3"):
            session.run(failing)
    finally:
        session.close()


def test_a_background_command_keeps_running_until_the_session_closes(tmp_path: Path) -> None:
    session = Session()
    doc = _write(tmp_path, "<!-- docs-test: background -->\n```console\n$ echo up; sleep 600\nup\n```\n"
                           "\n<!-- docs-test: poll=20 -->\n```console\n$ test -e flag && echo there\nthere\n```\n")  # fmt: skip
    server, polled = blocks(doc)
    try:
        session.run(server)
        (proc,) = session._groups
        assert proc.poll() is None
        (session.cwd / "flag").touch()  # what the polled command waits for
        session.run(polled)
    finally:
        session.close()
    assert proc.poll() is not None
