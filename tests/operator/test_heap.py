"""The operator's heap keeper (`controller.heap`): what has survived is frozen out of the full
collections' sight, and a cycle that died while frozen is collected at the next refreeze."""

from __future__ import annotations

import asyncio
import gc
import weakref

from folio.operator.controller.heap import keep_heap_settled
from tests.support.wait import until


class Cycle:
    def __init__(self) -> None:
        self.me = self  # only the cyclic collector can free it


async def test_survivors_are_frozen_and_a_dead_cycle_goes_at_the_refreeze() -> None:
    gc.unfreeze()
    cycle = Cycle()
    gone = weakref.ref(cycle)
    keeper = asyncio.create_task(keep_heap_settled(first_s=0.0, every_s=0.5))
    try:
        await until(lambda: gc.get_freeze_count() > 0, 10, "the first freeze", interval=0.01)
        # no await from here to the assert: the keeper cannot run in between
        del cycle
        gc.collect()
        assert gone() is not None, "a frozen cycle is out of the collector's sight"
        await until(lambda: gone() is None, 10, "the dead cycle collected at the refreeze", interval=0.05)
    finally:
        keeper.cancel()
        gc.unfreeze()
