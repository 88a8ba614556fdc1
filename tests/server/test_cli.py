"""`folio serve` refuses bad flags and unloadable models with a message and a non-zero exit."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from folio.engine.serve_cli import FlagError, tool_call_parser


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
        (["--enable-auto-tool-choice", "--tool-call-parser", "xml"], "invalid choice: 'xml'"),
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


def test_auto_tool_choice_takes_the_named_parser_else_the_familys() -> None:
    def parser(enabled: bool, name: str | None, model_type: str) -> str | None:
        args = argparse.Namespace(enable_auto_tool_choice=enabled, tool_call_parser=name)
        return tool_call_parser(args, SimpleNamespace(hf=SimpleNamespace(model_type=model_type)))

    assert parser(True, None, "qwen3") == "hermes"
    assert parser(True, "pythonic", "llama") == "pythonic"
    assert parser(False, "hermes", "qwen3") is None  # no "auto" tool choice without the switch
    with pytest.raises(FlagError, match="no default tool-call parser for model family 'gemma3_text'"):
        parser(True, None, "gemma3_text")
