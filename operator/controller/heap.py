"""The operator's heap at fleet scale: full garbage collections kept rare and short.

With hundreds of InferenceServices the operator holds hundreds of thousands of long-lived objects (kopf's
indexes of every child, each service's memo), and CPython's full collection walks all of them: at 300
services one took ~0.3 s and came every 5-10 s, stalling every pass behind it (the spec-change latency's
tail). Objects that have survived a while are moved out of the collector's sight (`gc.freeze`) once the
fleet is loaded and again every `REFREEZE_S`: a full collection then walks only what is newer. Acyclic
garbage among the frozen objects is still freed by reference counting; a cycle that dies while frozen
waits for the next refreeze, which collects everything first.
"""

from __future__ import annotations

import asyncio
import gc

FIRST_FREEZE_S = 60.0  # after the start: kopf's first listing and the first passes have filled the heap
REFREEZE_S = 600.0


async def keep_heap_settled(first_s: float = FIRST_FREEZE_S, every_s: float = REFREEZE_S) -> None:
    """Run for the operator's lifetime (cancelled at its cleanup)."""
    await asyncio.sleep(first_s)
    while True:
        gc.unfreeze()  # what died while frozen is collected now, once
        gc.collect()
        gc.freeze()
        await asyncio.sleep(every_s)
