"""glibc's heap for a CPU engine: the memory a step frees stays mapped for the next one.

Each step allocates its activations afresh (a prefill chunk's gate/up output alone is tens of MiB) and
frees them at its end. By default glibc serves blocks above a threshold that starts at 128 KiB with mmaps
of their own and returns the heap's free top to the kernel past 128 KiB, so the next step page-faults the
same memory in again; on a VM each fault is a trap to the hypervisor, and two threads faulting at once
contend for the process's memory-map lock. Fixing the mmap threshold at glibc's largest (32 MiB on 64-bit)
and trimming only past 1 GiB keeps a step's working set resident between steps; the heap settles at the
largest step's activations, which the engine's token budget bounds. bench/README.md has the figures.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_MMAP_THRESHOLD = 32 << 20  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit; glibc refuses anything larger
_TRIM_THRESHOLD = 1 << 30
ENABLED = True  # bench/throughput.py's folio-faulting phase measures the engine without it
_tuned: bool | None = None


def keep_step_memory() -> bool:
    """Tunes this process's glibc heap as above, once; False where the C library has no ``mallopt`` (musl,
    macOS) or refused a setting, which costs speed only."""
    global _tuned
    if not ENABLED:
        return False
    if _tuned is None:
        _tuned = _mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and _mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
        if not _tuned:
            log.info("glibc's mallopt is unavailable: step activations are page-faulted in on every step")
    return _tuned


def _mallopt(param: int, value: int) -> bool:
    try:  # the C library this process already runs on (no search for it on disk)
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(param, value) == 1
