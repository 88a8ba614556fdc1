"""Repo-wide pytest hooks: the `gpu` and `e2e` markers skip themselves where they cannot run, and a
session stops at once when the editable install lacks a module added since it was made."""

from __future__ import annotations

import os
import signal

import pytest

# A suite started in the background by a non-interactive shell (`make test &`, nohup) inherits SIGINT ignored,
# and so would every process the tests start: `folio up` and the servers they stop with SIGINT (as Ctrl-C
# would) would ignore it and be killed only once a wait for them ran out. Ctrl-C's own handler again, here
# and so (a handler is reset by exec, an ignored signal is not) in the children.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--with-e2e", action="store_true", help="run e2e tests against the current kube context")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    run_e2e = config.getoption("--with-e2e") or os.environ.get("FOLIO_E2E") == "1"
    need_gpu = [item for item in items if "gpu" in item.keywords]
    has_gpu = _cuda_available() if need_gpu else True
    for item in items:
        if "e2e" in item.keywords and not run_e2e:
            item.add_marker(pytest.mark.skip(reason="e2e: needs a cluster; pass --with-e2e or FOLIO_E2E=1"))
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="gpu: CUDA is not available here"))


@pytest.fixture(scope="session")
def folio_bin() -> str:
    """The `folio` console script of the environment running the tests."""
    import sys
    from pathlib import Path

    return str(Path(sys.executable).with_name("folio"))


def pytest_sessionstart(session: pytest.Session) -> None:
    from tests.support.editable import link_tree, python_sources, stale_links

    tree = link_tree()
    problems = stale_links(tree, python_sources()) if tree is not None else []
    if problems:
        shown = "\n  ".join(problems[:10])
        pytest.exit(f"the editable install is out of date; run `make link` (make test does):\n  {shown}", returncode=4)
