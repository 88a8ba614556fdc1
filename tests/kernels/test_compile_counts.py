"""Triton compiles nothing after start-up: the warm-up covers every variant an engine-like trace launches
(decode over batches 1–32 × contexts 1–8k with and without a window, prefills of 1–32 sequences), counted
by Triton's own specialization of each launch's arguments — no GPU needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("count_variants.py")


def test_the_warm_up_compiles_every_variant_the_engine_launches() -> None:
    pytest.importorskip("triton.backends.nvidia.compiler", reason="this triton build has no NVIDIA backend")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stdout + out.stderr
    counts = json.loads(out.stdout.splitlines()[-1])
    assert all(c["after_trace"] == c["warmed"] for c in counts.values()), counts  # no compile after start
    # split counts are powers of two up to 32: six decode variants, five merges (one split needs none)
    assert counts["_decode_kernel"]["warmed"] == 6 and counts["_merge_kernel"]["warmed"] == 5, counts
    assert counts["_prefill_kernel"]["warmed"] == 1, counts  # sequence count and table width not specialized
