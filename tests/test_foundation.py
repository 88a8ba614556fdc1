"""The project's skeleton: package mapping, the console script and its error handling."""

from __future__ import annotations

import operator
import subprocess
import sys
from pathlib import Path

import pytest

from folio.operator.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_operator_folder_has_no_init() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists()


def test_stdlib_operator_not_shadowed_at_repo_root() -> None:
    # pytest runs with the repo root on sys.path; `operator` must still be the standard library.
    assert hasattr(operator, "itemgetter")
    out = subprocess.run(
        [sys.executable, "-c", "import operator, sys; print(operator.__file__); print(sys.path[0])"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    assert str(ROOT / "operator") not in out.stdout.splitlines()[0]


def test_python_dash_m_works_at_repo_root() -> None:
    # `python -m` puts the cwd first on sys.path, the case that a top-level operator/__init__.py breaks.
    out = subprocess.run(
        [sys.executable, "-m", "folio.operator.cli", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    for name, (_, help_text) in COMMANDS.items():
        assert name in out.stdout
        assert help_text.split()[0] in out.stdout
    assert "option_strings" not in out.stdout  # a stray % in a help string garbles argparse's output


def test_packages_map_to_folders() -> None:
    import folio.engine
    import folio.kernels
    import folio.operator.spec

    assert Path(folio.operator.spec.__file__).parent == ROOT / "operator"
    assert Path(folio.engine.__file__).parent == ROOT / "engine"
    assert Path(folio.kernels.__file__).parent == ROOT / "kernels"


def test_every_design_command_is_registered() -> None:
    design = {"serve", "router", "operator", "crd", "up", "apply", "status", "promote", "abort", "retry", "digest"}
    assert design <= set(COMMANDS)
    build_parser()  # every command module imports and declares its flags


@pytest.mark.parametrize("argv", [["no-such-command"], ["digest"], ["digest", "a", "b"], []])
def test_bad_command_lines_print_usage_and_exit_2(argv: list[str], folio_bin: str) -> None:
    out = subprocess.run([folio_bin, *argv], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2
    assert "usage:" in out.stderr
    assert "Traceback" not in out.stderr


def test_cli_is_quick_to_start() -> None:
    # heavy imports (torch, kopf, uvicorn) belong inside each command's main, not at import time
    out = subprocess.run(
        [sys.executable, "-c", "import sys, folio.operator.cli as c; c.build_parser(); "
         "print(sorted(m for m in ('torch', 'kopf', 'uvicorn', 'transformers') if m in sys.modules))"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )
    assert out.stdout.strip() == "[]"


def test_wheel_maps_folders_into_the_folio_namespace(tmp_path: Path) -> None:
    # `pip install .` (not editable) must ship folio/operator, folio/engine, folio/kernels and nothing at top level
    import zipfile

    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True,
    )
    wheel = next(tmp_path.glob("folio-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    for required in ("folio/operator/cli.py", "folio/operator/spec.py", "folio/engine/digest.py", "folio/kernels/__init__.py"):
        assert required in names
    # the CPU attention kernel is compiled into the package (kernels/csrc/paged_decode_cpu.c)
    assert any(n.startswith("folio/kernels/_cpu_attention") and n.endswith(".so") for n in names)
    assert not any(n.startswith(("operator/", "engine/", "kernels/", "tests/")) for n in names)
    assert not any(n == "folio/operator/__init__.py" or n == "folio/__init__.py" for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "folio = folio.operator.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_closed_stdout_pipe_is_not_a_traceback(folio_bin: str) -> None:
    # `folio ... | head` closes the pipe early; the command must end quietly
    proc = subprocess.run(f"'{folio_bin}' --help | head -c 10 >/dev/null; exit ${{PIPESTATUS[0]}}",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, cwd=ROOT)
    assert "Traceback" not in proc.stderr
