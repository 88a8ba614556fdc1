"""The native CPU kernels' C extensions (``kernels/csrc``), loaded once each for their Python wrappers.

Each is optional (built by ``pip install`` where there is a C compiler): `load_native` gives None where it
was not built. Its calls go through a `NativeModule`, so that a CPU step graph can record them
(`folio.kernels.recording`), and a module with a thread team (`use_openmp`, ``csrc/cpu_team.h``) runs it on
torch's own OpenMP workers: threads of its own would compete with torch's while they spin after an op.
"""

from __future__ import annotations

import ctypes
import importlib
from pathlib import Path

from folio.kernels.recording import NativeModule, native

_OPENMP_NAMES = ("libgomp", "libiomp5", "libomp")  # GNU's, or Intel's and LLVM's (both export GOMP_parallel)
_OPENMP_SYMBOLS = ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")


def load_native(name: str) -> NativeModule | None:
    """``folio.kernels.<name>`` behind a `NativeModule`, its team (if it has one) on torch's OpenMP
    runtime; None where it was not built."""
    try:
        module = importlib.import_module(f"folio.kernels.{name}")
    except ImportError:
        return None
    if hasattr(module, "use_openmp"):
        share_torch_threads(module)
    return native(module)


def share_torch_threads(module: object) -> None:
    """Points a native kernel module's ``use_openmp`` at torch's OpenMP runtime, where there is one."""
    omp = _torch_openmp()
    if omp is not None:
        module.use_openmp(*(ctypes.cast(getattr(omp, name), ctypes.c_void_p).value  # type: ignore[attr-defined]
                            for name in _OPENMP_SYMBOLS))


def _torch_openmp() -> ctypes.CDLL | None:
    """The OpenMP runtime this process's torch runs its thread pool on, if it is one we can call."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split(maxsplit=5)[-1] for line in maps.splitlines() if line.count(" ") >= 5}
    for path in sorted(paths):
        if Path(path).name.startswith(_OPENMP_NAMES):
            try:  # already loaded, so this only returns a handle to it
                lib = ctypes.CDLL(path)
                if all(hasattr(lib, name) for name in _OPENMP_SYMBOLS):
                    return lib
            except OSError:
                continue
    return None
