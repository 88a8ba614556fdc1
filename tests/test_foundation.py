"""The project's skeleton: package mapping, the console script and its error handling."""

from __future__ import annotations

import json
import operator
import subprocess
import sys
from pathlib import Path

import pytest

from folio.operator.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("folder", ["operator", "engine", "kernels"])
def test_package_folders_have_no_init(folder: str) -> None:
    assert not (ROOT / folder / "__init__.py").exists()


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


def test_bare_engine_and_kernels_run_no_folio_code_at_repo_root() -> None:
    # Only folio.engine and folio.kernels are Folio's; at the repo root the bare names are empty namespaces,
    # or, for `kernels`, the PyPI package of that name where it is installed (transformers requires it).
    out = subprocess.run(
        [sys.executable, "-c", "import json, engine, kernels; print(json.dumps([engine.__file__, "
         "hasattr(engine, 'LLM'), kernels.__file__, list(getattr(kernels, '__path__', []))]))"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    engine_file, has_llm, kernels_file, kernels_path = json.loads(out.stdout)
    assert engine_file is None and not has_llm
    assert kernels_file is None or not Path(kernels_file).is_relative_to(ROOT / "kernels")
    if kernels_file is not None:  # the installed package: none of Folio's folders is part of it
        assert not any(Path(p).resolve() == (ROOT / "kernels").resolve() for p in kernels_path)


def test_transformers_kernels_probe_is_the_same_at_repo_root(tmp_path: Path) -> None:
    # transformers probes the PyPI package `kernels` with importlib; Folio's kernels/ must not answer it
    probe = "from transformers.utils.import_utils import is_kernels_available; print(is_kernels_available())"
    here, elsewhere = (
        subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True, text=True, check=True).stdout
        for cwd in (ROOT, tmp_path)
    )
    assert here == elsewhere and here.strip() in ("True", "False")


def test_offline_api_imports_from_the_repo_root_and_elsewhere(tmp_path: Path) -> None:
    code = "from folio.engine import LLM, SamplingParams; print(LLM.__module__, SamplingParams.__module__)"
    for cwd in (ROOT, tmp_path):
        out = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["folio.engine.llm", "folio.engine.sampling_params"]


def test_packages_map_to_folders() -> None:
    import folio.engine
    import folio.kernels.decode_attention
    import folio.operator.spec

    # an editable install links the sources, a regular one copies them: both resolve here in a checkout
    assert Path(folio.operator.spec.__file__).resolve().parent == ROOT / "operator"
    assert Path(folio.engine.__file__).resolve() == ROOT / "engine" / "api.py"  # folio.engine's package module
    assert Path(folio.kernels.decode_attention.__file__).resolve().parent == ROOT / "kernels"


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


@pytest.mark.parametrize(("argv", "said"), [
    # an abbreviation is no longer taken for the flag it abbreviates: a typo is an error naming the flag
    (["serve", "--model", "m", "--max-num-seq", "4"], "unrecognized arguments: --max-num-seq 4 "
                                                      "(--max-num-seq: did you mean --max-num-seqs?)"),
    (["status", "--outptu=json"], "unrecognized arguments: --outptu=json (--outptu: did you mean --output?)"),
    (["serve", "--model", "m", "--bogus"], "unrecognized arguments: --bogus"),  # nothing close: no guess
])
def test_mistyped_flags_are_errors_that_name_the_flag(argv: list[str], said: str, folio_bin: str) -> None:
    out = subprocess.run([folio_bin, *argv], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1].endswith(f"error: {said}"), out.stderr


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
    import os
    import shutil
    import sysconfig
    import zipfile

    # built from a copy of what the Dockerfile copies: an in-tree build/lib would keep files deleted since
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("operator", "engine", "kernels"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    # The extensions are compiled with setup.py's own flags and then -O0 (gcc obeys the last -O): what the
    # wheel holds is the same, its build takes seconds rather than half a minute (decode_gemm_cpu.c at -O3).
    # A flag or a source the compiler refuses still leaves the extension out, as it would at -O3.
    cc = tmp_path / "cc"
    cc.write_text(f'#!/bin/sh\nexec {os.environ.get("CC") or sysconfig.get_config_var("CC")} "$@" -O0\n')
    cc.chmod(0o755)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
        check=True, capture_output=True, env={**os.environ, "CC": str(cc)},
    )
    wheel = next(tmp_path.glob("folio-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    # exactly the modules of the three folders, engine/api.py under its installed name
    modules = {f"folio/{p.relative_to(src).as_posix()}" for f in ("operator", "engine", "kernels")
               for p in (src / f).rglob("*.py")}
    modules = {"folio/engine/__init__.py" if m == "folio/engine/api.py" else m for m in modules}
    assert {n for n in names if n.endswith(".py")} == modules
    for required in ("folio/operator/cli.py", "folio/operator/spec.py", "folio/engine/digest.py",
                     "folio/engine/__init__.py", "folio/kernels/decode_attention.py"):
        assert required in names
    # engine/api.py is folio.engine's package module; the wheel carries it under that name only
    wheel_init = zipfile.ZipFile(wheel).read("folio/engine/__init__.py").decode()
    assert wheel_init == (ROOT / "engine" / "api.py").read_text() and "folio/engine/api.py" not in names
    # the CPU attention kernel is compiled into the package (kernels/csrc/paged_decode_cpu.c)
    assert any(n.startswith("folio/kernels/_cpu_attention") and n.endswith(".so") for n in names)
    assert not any(n.startswith(("operator/", "engine/", "kernels/", "tests/")) for n in names)
    assert not any(n in ("folio/__init__.py", "folio/operator/__init__.py", "folio/kernels/__init__.py") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "folio = folio.operator.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_closed_stdout_pipe_is_not_a_traceback(folio_bin: str) -> None:
    # `folio ... | head` closes the pipe early; the command must end quietly
    proc = subprocess.run(f"'{folio_bin}' --help | head -c 10 >/dev/null; exit ${{PIPESTATUS[0]}}",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, cwd=ROOT)
    assert "Traceback" not in proc.stderr


def test_a_stale_editable_link_tree_is_reported(tmp_path: Path) -> None:
    from tests.support.editable import link_tree, python_sources, stale_links

    src, tree = tmp_path / "src", tmp_path / "tree"
    src.mkdir()
    tree.mkdir()
    for name in ("kept.py", "added.py", "gone.py"):
        (src / name).write_text("")
    (tree / "kept.py").symlink_to(src / "kept.py")
    (tree / "__init__.py").symlink_to(src / "kept.py")  # a renamed link (engine/api.py) counts as a link
    (tree / "gone.py").symlink_to(src / "gone.py")
    (src / "gone.py").unlink()
    sources = sorted(src.glob("*.py"))
    assert stale_links(tree, sources) == [f"not linked: {src / 'added.py'}", f"removed: {src / 'gone.py'}"]
    # and this checkout's own install is up to date (else the session would not have started)
    tree_here = link_tree()
    assert tree_here is None or stale_links(tree_here, python_sources()) == []
