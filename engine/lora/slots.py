"""The adapters the engine knows, the host cache of loaded ones and the device slots they run from.

Check/act pairs for the scheduler: `can_acquire` says whether a request's adapter can get a slot now
(never loading anything); `acquire` gives it one, loading from disk (through the host cache) and copying
into the layers' stacked buffers when it is not in a slot yet. Slots are shared: each running request
holds a reference; a released adapter stays in its slot for reuse until a slot is needed for another
(least recently used first). A request whose adapter finds no slot waits; it is never failed for that.

A queued request holds a claim on its adapter (`claim`, turned into a reference by `acquire` or dropped by
`unclaim`): an adapter removed while requests wait for it is kept, for them only, until the last one has
run, so unloading an adapter lets every request already accepted under it finish.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from folio.engine.config import ModelConfig
from folio.engine.lora.adapter import LoRAAdapter, LoRAError, LoRAWeights, load_adapter
from folio.engine.lora.layout import LoRALayout
from folio.engine.lora.request import LoRARequest

# (layer, projection) → (a [S, R_p, in], b [S, out, R_p]): the layers' stacked adapter buffers
Stacks = Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
# a tensor-parallel rank's piece of a pair: (layer, projection, pair) → the pair its stacks hold
Shard = Callable[[int, str, LoRAWeights], LoRAWeights]


@dataclass
class _Slot:
    lora_int_id: int = 0  # 0: free
    refs: int = 0
    last_used: int = 0  # acquire counter when last acquired: the LRU order


class LoRASlots:
    def __init__(
        self,
        max_loras: int,
        max_cpu_loras: int | None = None,
        *,
        model_config: ModelConfig | LoRALayout,
        max_rank: int,
        stacks: Stacks | None = None,
        dtype: torch.dtype = torch.float32,
        shard: Shard | None = None,
        loader: Callable[..., LoRAAdapter] = load_adapter,
    ) -> None:
        max_cpu_loras = max_loras if max_cpu_loras is None else max_cpu_loras
        if max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {max_loras}")
        if max_cpu_loras < max_loras:
            raise ValueError(f"max_cpu_loras ({max_cpu_loras}) must be >= max_loras ({max_loras})")
        self.max_loras, self.max_cpu_loras, self.max_rank = max_loras, max_cpu_loras, max_rank
        self.layout = model_config if isinstance(model_config, LoRALayout) else LoRALayout(model_config)
        self.stacks: Stacks = stacks if stacks is not None else {}
        for a_stack, b_stack in self.stacks.values():
            assert a_stack.shape[0] >= max_loras and b_stack.shape[0] >= max_loras, "a stack per slot"
        self.dtype, self.shard, self.loader = dtype, shard, loader
        self.requests: dict[str, LoRARequest] = {}  # registered adapters by name
        self.by_id: dict[int, LoRARequest] = {}
        self.removed: dict[int, LoRARequest] = {}  # unregistered while in use or claimed: kept for those
        self.claims: Counter[int] = Counter()  # queued requests that will acquire the adapter
        self.cache: OrderedDict[int, LoRAAdapter] = OrderedDict()  # host cache, least recently used first
        self.slots = [_Slot() for _ in range(max_loras)]
        self.slot_by_id: dict[int, int] = {}
        self._clock = 0
        self.last_load_s = 0.0  # seconds the last copy into a slot took (with its disk load, if any)

    # --- the known adapters ---------------------------------------------------------------------------

    def register(self, request: LoRARequest) -> None:
        """Make ``request``'s adapter known (the files are read when a request first needs it; check
        them first with `load` where an error must reach the caller now). Registering the same request
        again is a no-op; another adapter under a taken name or id is refused."""
        known = self.requests.get(request.lora_name)
        if known == request:
            return
        if known is not None:
            raise LoRAError(f"adapter {request.lora_name!r} is already loaded")
        other = self.by_id.get(request.lora_int_id) or self.removed.get(request.lora_int_id)
        if other is not None:
            raise LoRAError(f"adapter id {request.lora_int_id} is taken by {other.lora_name!r}")
        self.requests[request.lora_name] = request
        self.by_id[request.lora_int_id] = request

    def unregister(self, name: str) -> LoRARequest:
        return self.remove(name)

    def is_registered(self, name: str) -> bool:
        return name in self.requests

    def get(self, name: str) -> LoRARequest | None:
        return self.requests.get(name)

    def loaded(self) -> list[LoRARequest]:
        """The registered adapters, in registration order (what /v1/models lists)."""
        return list(self.requests.values())

    def remove(self, name: str) -> LoRARequest:
        """Unregister ``name``: new requests for it must be refused (`is_registered`); requests running
        under it keep its slot until they release it, requests queued under it (claims) can still acquire
        it, and it is forgotten (its slot freed) after the last of them."""
        request = self.requests.pop(name, None)
        if request is None:
            raise KeyError(f"adapter {name!r} is not loaded")
        del self.by_id[request.lora_int_id]
        self.removed[request.lora_int_id] = request
        self._settle(request.lora_int_id)
        self._check()
        return request

    def claim(self, lora_int_id: int) -> None:
        """A request under this registered adapter was queued: it will `acquire` it (or `unclaim`)."""
        assert lora_int_id in self.by_id, f"adapter id {lora_int_id} is not registered"
        self.claims[lora_int_id] += 1

    def unclaim(self, lora_int_id: int) -> None:
        """A queued request ended without acquiring its adapter (aborted, or its adapter failed to load)."""
        assert self.claims[lora_int_id] > 0, f"adapter id {lora_int_id} unclaimed more often than claimed"
        self.claims[lora_int_id] -= 1
        self._settle(lora_int_id)
        self._check()

    # --- host cache -----------------------------------------------------------------------------------

    def load(self, lora_int_id: int) -> LoRAAdapter:
        """The adapter, from the host cache or from disk (then cached, evicting the least recently used).
        Raises `LoRAError` for an adapter the engine cannot serve."""
        adapter = self.cache.get(lora_int_id)
        if adapter is not None:
            self.cache.move_to_end(lora_int_id)
            return adapter
        request = self.by_id.get(lora_int_id) or self.removed[lora_int_id]
        adapter = self.loader(
            request.lora_path, self.layout, max_rank=self.max_rank, digest=request.digest, dtype=self.dtype,
            name=request.lora_name,
        )
        if lora_int_id in self.by_id:  # a removed adapter is not cached again
            self.cache[lora_int_id] = adapter
            while len(self.cache) > self.max_cpu_loras:
                self.cache.popitem(last=False)
        return adapter

    def cached(self) -> list[int]:
        """Ids in the host cache, least recently used first."""
        return list(self.cache)

    # --- device slots ---------------------------------------------------------------------------------

    def slot_of(self, lora_int_id: int) -> int | None:
        return self.slot_by_id.get(lora_int_id)

    def can_acquire(self, lora_int_id: int) -> bool:
        """Whether a request under this adapter can run now: the adapter is registered (or removed but
        claimed by queued requests) and in a slot already, or a slot is free or holds one no request uses."""
        known = lora_int_id in self.by_id or (lora_int_id in self.removed and self.claims[lora_int_id] > 0)
        if not known:
            return False
        return lora_int_id in self.slot_by_id or any(s.refs == 0 for s in self.slots)

    def acquire(self, lora_int_id: int) -> int:
        """A reference to the adapter's slot (its index in the stacks), loading it into one if needed.
        Raises `LoRAError` where its files cannot be served; the slots are then unchanged."""
        assert self.can_acquire(lora_int_id), f"adapter id {lora_int_id} cannot get a slot now"
        self._clock += 1
        index = self.slot_by_id.get(lora_int_id)
        if index is None:
            start = time.perf_counter()
            adapter = self.load(lora_int_id)  # before touching a slot: a bad adapter changes nothing
            index = self._victim()
            if self.slots[index].lora_int_id:
                self._free(index)
            self._write(index, adapter)
            self.slots[index].lora_int_id = lora_int_id
            self.slot_by_id[lora_int_id] = index
            self.last_load_s = time.perf_counter() - start
        slot = self.slots[index]
        slot.refs += 1
        slot.last_used = self._clock
        if self.claims[lora_int_id] > 0:  # a queued request's claim becomes its reference
            self.claims[lora_int_id] -= 1
        self._check()
        return index

    def release(self, lora_int_id: int) -> None:
        """Drop a reference; the adapter stays in its slot for reuse (unless it was removed meanwhile)."""
        index = self.slot_by_id[lora_int_id]
        slot = self.slots[index]
        assert slot.refs > 0, f"adapter id {lora_int_id} released more often than acquired"
        slot.refs -= 1
        self._settle(lora_int_id)
        self._check()

    def active(self) -> list[str]:
        """Names of the adapters running requests use (removed ones included until they finish)."""
        names = {**{r.lora_int_id: r.lora_name for r in self.by_id.values()},
                 **{i: r.lora_name for i, r in self.removed.items()}}
        return [names[s.lora_int_id] for s in self.slots if s.refs]

    def _settle(self, lora_int_id: int) -> None:
        """Forget a removed adapter once nothing uses or claims it (its slot freed, if it has one)."""
        if lora_int_id not in self.removed or self.claims[lora_int_id] > 0:
            return
        index = self.slot_by_id.get(lora_int_id)
        if index is not None and self.slots[index].refs:
            return
        del self.removed[lora_int_id]
        del self.claims[lora_int_id]
        self.cache.pop(lora_int_id, None)
        if index is not None:
            self._free(index)

    def _victim(self) -> int:
        """A free slot, else the least recently used one that no request holds."""
        free = [i for i, s in enumerate(self.slots) if not s.lora_int_id]
        if free:
            return free[0]
        idle = [i for i, s in enumerate(self.slots) if s.refs == 0]
        assert idle, "no slot to evict"
        return min(idle, key=lambda i: self.slots[i].last_used)

    def _free(self, index: int) -> None:
        slot = self.slots[index]
        assert slot.refs == 0
        del self.slot_by_id[slot.lora_int_id]
        self.slots[index] = _Slot()  # the stacks keep its tensors until the slot is written again

    def _write(self, index: int, adapter: LoRAAdapter) -> None:
        """Copy the adapter's pairs into slot ``index`` of every stack; zeros where it adapts nothing."""
        for (layer, proj), (a_stack, b_stack) in self.stacks.items():
            pair = adapter.get(layer, proj)
            if pair is not None and self.shard is not None:
                pair = self.shard(layer, proj, pair)
            if pair is None:
                a_stack[index].zero_()
                b_stack[index].zero_()
                continue
            assert a_stack.shape[1:] == pair.a.shape and b_stack.shape[1:] == pair.b.shape, (
                f"layer {layer} {proj}: stacks {tuple(a_stack.shape[1:])}/{tuple(b_stack.shape[1:])}, "
                f"adapter {tuple(pair.a.shape)}/{tuple(pair.b.shape)}"
            )
            a_stack[index].copy_(pair.a, non_blocking=True)
            b_stack[index].copy_(pair.b, non_blocking=True)
        missing = [key for key, per in _pairs(adapter) if key not in self.stacks]
        assert not self.stacks or not missing, f"no stacks for {missing}"

    def _check(self) -> None:
        assert len(self.slot_by_id) <= self.max_loras
        assert len(self.cache) <= self.max_cpu_loras
        for lora_int_id, index in self.slot_by_id.items():
            assert self.slots[index].lora_int_id == lora_int_id
            assert lora_int_id in self.by_id or lora_int_id in self.removed
        for lora_int_id in self.removed:
            index = self.slot_by_id.get(lora_int_id)
            in_use = index is not None and self.slots[index].refs > 0
            assert in_use or self.claims[lora_int_id] > 0, "a removed adapter lingers only while used or claimed"
        assert all(s.refs == 0 for s in self.slots if not s.lora_int_id)


def _pairs(adapter: LoRAAdapter) -> list[tuple[tuple[int, str], LoRAWeights]]:
    return [((layer, proj), w) for layer, per in enumerate(adapter.layers) for proj, w in per.items()]
