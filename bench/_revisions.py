"""What the kernel benchmarks' ``--against REV`` share: a past revision's kernel sources, and loading a built
extension under a name of its own."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def kernel_sources_at(rev: str, dest: Path) -> Path:
    """Writes git revision ``rev``'s kernels/csrc into ``dest`` (made if missing) and returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:kernels/csrc"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split()  # fmt: skip
    for name in names:
        text = subprocess.run(["git", "show", f"{rev}:kernels/csrc/{name}"], cwd=ROOT, check=True,
                              capture_output=True).stdout  # fmt: skip
        (dest / name).write_bytes(text)
    return dest


def load_extension(name: str, so: Path) -> ModuleType:
    """The C extension at ``so`` imported as ``name`` (its init function must be PyInit_<last part of name>)."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(so))
    spec = importlib.util.spec_from_file_location(name, so, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
