"""`folio.engine.cpu_heap`: with it, the memory a step frees stays in the heap for the next step; without it
glibc gives the heap's free top back to the kernel and serves large blocks with mmaps of their own. Each
case runs in a fresh interpreter (mallopt is per process and cannot be undone) and reads glibc's own
accounting (``mallinfo2``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# 256 blocks of 64 KiB freed, then one block of 24 MiB held: how much of the freed 16 MiB the heap kept
# (its free bytes, fordblks, against before the blocks: free space the interpreter's start-up left in the
# heap cancels out, wherever the blocks landed) and how much heap memory is in mmapped blocks (hblkhd).
STEP = """
import ctypes, json, sys
from folio.engine import cpu_heap

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
tuned = cpu_heap.keep_step_memory() if sys.argv[1] == "tuned" else None
free = libc.mallinfo2().fordblks
blocks = [None] * 256  # the list first: its buffer, reallocated as it grew, could sit above the blocks
for i in range(256):
    blocks[i] = bytearray(64 << 10)
del blocks
kept = libc.mallinfo2().fordblks - free
big = bytearray(24 << 20)
print(json.dumps({"tuned": tuned, "kept": kept, "mmapped": libc.mallinfo2().hblkhd}))
"""
MIB = 1 << 20


def heap_after_a_step(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", STEP, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def default() -> dict:
    return heap_after_a_step("default")


def test_freed_memory_stays_in_the_heap(default: dict) -> None:
    tuned = heap_after_a_step("tuned")
    assert tuned["tuned"] is True
    assert default["kept"] < 4 * MIB < 15 * MIB <= tuned["kept"]  # glibc's default trimmed it


def test_blocks_up_to_32_mib_come_from_the_heap(default: dict) -> None:
    tuned = heap_after_a_step("tuned")
    assert tuned["mmapped"] < 24 * MIB <= default["mmapped"]  # glibc's default mapped one of its own


def test_it_is_a_no_op_when_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from folio.engine import cpu_heap

    monkeypatch.setattr(cpu_heap, "ENABLED", False)
    assert cpu_heap.keep_step_memory() is False
