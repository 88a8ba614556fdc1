"""Run every benchmark in bench/ in turn (each prints its own figures and ratios)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    failed = 0
    for script in sorted(HERE.glob("*.py")):
        if script.name == "run_all.py" or script.name.startswith("_"):
            continue
        print(f"== {script.name}", flush=True)
        failed += subprocess.call([sys.executable, str(script)]) != 0
    sys.exit(1 if failed else 0)
