"""bench/gpu_check.sh --dry-run passes with only the GPU image's packages: test collection and the
benchmarks' imports must not need pydantic, fastapi, uvicorn, kopf, kubernetes or gguf."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MISSING_ON_GPU_IMAGE = ("pydantic", "fastapi", "uvicorn", "kopf", "kubernetes", "gguf")

BLOCKER = f'''
import sys

BLOCKED = {set(MISSING_ON_GPU_IMAGE)!r}


class _NotOnTheGpuImage:
    """Makes importing a package the GPU image lacks fail as if it were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not on the GPU image)", name=name)
        return None


sys.meta_path.insert(0, _NotOnTheGpuImage())
'''


def blocked_env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = dict(os.environ, OUT=str(tmp_path / "out"), PY=sys.executable)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    return env


def test_the_blocker_blocks(tmp_path: Path) -> None:
    probe = subprocess.run([sys.executable, "-c", "import pydantic"], env=blocked_env(tmp_path),
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode != 0 and "not on the GPU image" in probe.stderr


def test_dry_run_passes_without_the_missing_packages(tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run"], cwd=ROOT,
                          env=blocked_env(tmp_path), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert "gpu_check --dry-run: ok" in log
    assert "tests collected" in log and "bench/gpu_kernels.py --dry-run: ok" in log
    assert "345 s of a 360 s budget" in log and "145 s of a 170 s budget" in log and "over budget" not in log


def test_a_plan_over_its_time_budget_fails_the_dry_run(tmp_path: Path) -> None:
    # the device call must fit: the dry run adds up each plan's limits and fails one over its budget
    env = {**blocked_env(tmp_path), "GPU_CHECK_BUDGET_S": "200"}
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--plan"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    log = (tmp_path / "out" / "gpu_check.log").read_text()
    assert "345 s of a 200 s budget" in log and "over budget" in log and "gpu_check --plan: failed" in log
    assert "145 s of a 170 s budget" in log  # --quick's plan still fits its own
