"""`folio serve` refuses bad flags and unloadable models with a message and a non-zero exit."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


def run(folio_bin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([folio_bin, "serve", *args], capture_output=True, text=True, timeout=120)


def test_help_lists_the_test_aids(folio_bin: str) -> None:
    out = run(folio_bin, "--help").stdout
    for flag in (
        "--max-queued-requests",
        "--shutdown-timeout",
        "--max-n",
        "--fault-error-rate",
        "--fault-latency-ms",
    ):
        assert flag in out
    assert "test aids, off by default" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fault-error-rate", "2"], "fault error rate must be in [0, 1]"),
        (["--max-n", "0"], "--max-n must be >= 1"),
        (["--block-size", "3"], "block_size must be a power of two"),
        (["--metrics-port", "-1"], "--metrics-port must be 0 (off) or a port"),
        (["--port", "8123", "--metrics-port", "8123"], "--metrics-port must differ from --port"),
        (["--lora-modules", "sql=/adapters/sql"], "--lora-modules needs --enable-lora"),
        (["--enable-lora", "--lora-modules", "sql"], "--lora-modules 'sql': expected NAME=PATH"),
    ],
)
def test_bad_flags_exit_2(folio_bin: str, tmp_path: Path, args: list[str], message: str) -> None:
    result = run(folio_bin, "--model", str(tmp_path), *args)
    assert result.returncode == 2
    assert message in result.stderr


def test_a_missing_model_exits_1(folio_bin: str, tmp_path: Path) -> None:
    result = run(folio_bin, "--model", str(tmp_path / "nope"))
    assert result.returncode == 1
    assert "cannot load" in result.stderr
