"""The command-line tools tests run (promtool, prometheus): `make tools` unpacks them into .venv/tools/bin."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

TOOLS_BIN = Path(__file__).resolve().parents[2] / ".venv" / "tools" / "bin"


def find_tool(name: str) -> str:
    """``$FOLIO_<NAME>``, else .venv/tools/bin, else PATH; fails the test (never skips) when absent."""
    for candidate in (os.environ.get(f"FOLIO_{name.upper()}"), str(TOOLS_BIN / name)):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found: `make tools` unpacks Debian's prometheus package into .venv/tools")
    return found
