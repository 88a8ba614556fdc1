"""Device slots and the host cache: sharing, release, LRU eviction, waiting when no slot is free,
removal while in use, and the stacks' contents after each copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from folio.engine.loader import load_model_config
from folio.engine.lora import LoRAAdapter, LoRAError, LoRALayout, LoRARequest, LoRASlots, load_adapter
from tests.support.lora import make_adapter
from tests.support.models import make_tiny_llama

MAX_RANK = 16


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Llama's layout and four adapters: three on every projection, one on q_proj only."""
    root = tmp_path_factory.mktemp("lora-slots")
    model_dir = make_tiny_llama(root / "model")
    layout = LoRALayout(load_model_config(model_dir)[0])
    adapters = {
        f"a{i}": make_adapter(model_dir, root / f"a{i}", r=8 if i < 3 else 16, seed=i,
                              target_modules=["q_proj"] if i == 4 else None)
        for i in range(1, 5)
    }
    return layout, adapters


class CountingLoader:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, path, layout, **kwargs) -> LoRAAdapter:
        self.calls.append(Path(path).name)
        return load_adapter(path, layout, **kwargs)


def _slots(setup, max_loras: int = 2, max_cpu_loras: int | None = None) -> tuple[LoRASlots, CountingLoader]:
    layout, adapters = setup
    loader = CountingLoader()
    stacks = layout.allocate(max_loras, MAX_RANK, torch.float32)
    slots = LoRASlots(max_loras, max_cpu_loras, model_config=layout, max_rank=MAX_RANK, stacks=stacks, loader=loader)
    for i, (name, path) in enumerate(adapters.items(), start=1):
        slots.register(LoRARequest(name, i, str(path)))
    return slots, loader


def _assert_slot_holds(slots: LoRASlots, index: int, lora_int_id: int) -> None:
    adapter = slots.load(lora_int_id)
    for (layer, proj), (a_stack, b_stack) in slots.stacks.items():
        pair = adapter.get(layer, proj)
        if pair is None:
            assert not a_stack[index].any() and not b_stack[index].any()
        else:
            assert torch.equal(a_stack[index], pair.a) and torch.equal(b_stack[index], pair.b)


def test_acquire_shares_and_copies(setup) -> None:
    slots, loader = _slots(setup)
    assert slots.can_acquire(1)
    s1 = slots.acquire(1)
    assert slots.acquire(1) == s1 and slots.slots[s1].refs == 2  # shared: one copy
    s2 = slots.acquire(2)
    assert s2 != s1 and {slots.slot_of(1), slots.slot_of(2)} == {0, 1}
    assert loader.calls == ["a1", "a2"] and slots.last_load_s > 0
    _assert_slot_holds(slots, s1, 1)
    _assert_slot_holds(slots, s2, 2)
    assert sorted(slots.active()) == ["a1", "a2"]


def test_no_free_slot_waits_then_evicts_least_recently_used(setup) -> None:
    slots, _ = _slots(setup)
    s1, s2 = slots.acquire(1), slots.acquire(2)
    assert not slots.can_acquire(3)  # both held: the request waits
    assert slots.can_acquire(1)  # but more requests under a held adapter run
    slots.release(2)
    slots.release(1)
    assert slots.slot_of(1) == s1 and slots.slot_of(2) == s2  # kept for reuse
    slots.acquire(2)
    slots.release(2)  # 2 is now the most recently used: 1 goes first
    assert slots.acquire(3) == s1
    assert slots.slot_of(1) is None and slots.slot_of(3) == s1
    _assert_slot_holds(slots, s1, 3)
    # an adapter on q_proj only zeroes every other projection of the slot it takes
    assert slots.acquire(4) == s2
    _assert_slot_holds(slots, s2, 4)
    assert not slots.stacks[(0, "o")][1][s2].any() and slots.stacks[(0, "qkv")][1][s2].any()


def test_release_more_than_acquired_asserts(setup) -> None:
    slots, _ = _slots(setup)
    slots.acquire(1)
    slots.release(1)
    with pytest.raises(AssertionError, match="released more often"):
        slots.release(1)


def test_remove_while_in_use(setup) -> None:
    slots, _ = _slots(setup)
    index = slots.acquire(1)
    removed = slots.remove("a1")
    assert removed.lora_int_id == 1 and not slots.is_registered("a1")
    assert [r.lora_name for r in slots.loaded()] == ["a2", "a3", "a4"]
    assert not slots.can_acquire(1)  # new requests are refused by the caller; the slot stays for the running
    assert slots.slot_of(1) == index and slots.active() == ["a1"]
    with pytest.raises(LoRAError, match="adapter id 1 is taken by 'a1'"):
        slots.register(LoRARequest("again", 1, "/x"))
    slots.release(1)
    assert slots.slot_of(1) is None and all(s.lora_int_id == 0 for s in slots.slots)
    slots.register(LoRARequest("a1", 1, str(setup[1]["a1"])))  # the id is free again
    assert slots.acquire(1) == 0


def test_remove_idle_frees_its_slot(setup) -> None:
    slots, _ = _slots(setup)
    slots.acquire(1)
    slots.release(1)
    slots.remove("a1")
    assert slots.slot_of(1) is None and 1 not in slots.cached()
    with pytest.raises(KeyError, match="'a1' is not loaded"):
        slots.remove("a1")


def test_a_removed_adapter_is_kept_for_the_requests_that_claimed_it(setup) -> None:
    slots, _ = _slots(setup, max_loras=1)
    slots.claim(2)
    slots.claim(2)
    held = slots.acquire(1)  # the one slot is taken: the claimants wait
    assert not slots.can_acquire(2)
    slots.remove("a2")
    assert not slots.is_registered("a2") and 2 in slots.removed
    slots.release(1)
    assert slots.can_acquire(2)  # for its claimants, although removed
    index = slots.acquire(2)
    assert index == held and slots.claims[2] == 1
    _assert_slot_holds(slots, index, 2)
    slots.unclaim(2)  # the other claimant was aborted
    assert not slots.can_acquire(2)  # no claim left: nobody new may take it
    slots.release(2)
    assert 2 not in slots.removed and slots.slot_of(2) is None and not +slots.claims
    with pytest.raises(AssertionError, match="unclaimed more often"):
        slots.unclaim(1)


def test_host_cache_is_lru(setup) -> None:
    slots, loader = _slots(setup, max_loras=1, max_cpu_loras=2)
    for i in (1, 2):
        slots.acquire(i)
        slots.release(i)
    assert slots.cached() == [1, 2]
    slots.acquire(1)  # from the host cache, not disk
    slots.release(1)
    assert loader.calls == ["a1", "a2"] and slots.cached() == [2, 1]
    slots.acquire(3)
    slots.release(3)
    assert slots.cached() == [1, 3]  # 2 was the least recently used
    slots.acquire(2)
    assert loader.calls == ["a1", "a2", "a3", "a2"]


def test_register_rules(setup) -> None:
    slots, _ = _slots(setup)
    same = slots.get("a1")
    assert same is not None
    slots.register(same)  # idempotent
    with pytest.raises(LoRAError, match="'a1' is already loaded"):
        slots.register(LoRARequest("a1", 9, "/elsewhere"))
    with pytest.raises(LoRAError, match="adapter id 2 is taken by 'a2'"):
        slots.register(LoRARequest("b", 2, "/elsewhere"))
    assert not slots.can_acquire(99)  # unknown ids never run
    with pytest.raises(ValueError, match="max_cpu_loras"):
        LoRASlots(2, 1, model_config=setup[0], max_rank=MAX_RANK)


def test_a_bad_adapter_leaves_the_slots_unchanged(setup, tmp_path: Path) -> None:
    slots, _ = _slots(setup, max_loras=1)
    slots.acquire(1)
    slots.release(1)
    (tmp_path / "adapter_config.json").write_text("{}")
    slots.register(LoRARequest("broken", 7, str(tmp_path)))
    assert slots.can_acquire(7)
    with pytest.raises(LoRAError, match=r"adapter_model\.safetensors is missing"):
        slots.acquire(7)
    assert slots.slot_of(1) == 0 and slots.slot_of(7) is None
    _assert_slot_holds(slots, 0, 1)
    small = LoRASlots(1, model_config=setup[0], max_rank=8)
    small.register(LoRARequest("a4", 4, str(setup[1]["a4"])))
    with pytest.raises(LoRAError, match="rank 16 is above --max-lora-rank 8"):
        small.acquire(4)
    assert small.slot_of(4) is None and small.cached() == []


def test_smollm2_rank16_loads_into_a_slot_quickly(smollm2_gguf_path: Path, tmp_path: Path) -> None:
    """The issue's target is 0.5 s from disk into a free slot (the bench measures it); here a loose bound
    on a shared test machine, with the time printed."""
    from tests.support.lora import write_random_adapter

    layout = LoRALayout(load_model_config(smollm2_gguf_path)[0])
    adapter_dir = write_random_adapter(layout, tmp_path / "smol-r16", r=16)
    stacks = layout.allocate(2, MAX_RANK, torch.float32)
    slots = LoRASlots(2, model_config=layout, max_rank=MAX_RANK, stacks=stacks)
    slots.register(LoRARequest("smol", 1, str(adapter_dir)))
    index = slots.acquire(1)
    print(f"SmolLM2 rank-16 adapter from disk into a slot: {slots.last_load_s * 1000:.0f} ms")
    assert slots.last_load_s < 2.0
    _assert_slot_holds(slots, index, 1)
    assert len(slots.load(1).modules) == 7 * layout.num_layers


def test_blocks_and_a_tensor_parallel_ranks_share_of_them(setup) -> None:
    # the tiny Llama: q 64 rows, k and v 32 each; gate and up 128 each
    from folio.engine.distributed.lora import local_blocks
    from folio.engine.distributed.sharding import ParamShard

    layout, _ = setup
    blocks = layout.blocks
    assert blocks[(0, "qkv")] == ((0, 64), (64, 96), (96, 128)) and blocks[(0, "gate_up")] == ((0, 128), (128, 256))
    assert blocks[(0, "o")] == ((0, 64),) and blocks[(0, "down")] == ((0, 64),)
    # rank 1 of 2: the second half of q's, k's and v's rows (column-parallel), half of down's inputs
    shards = {}
    for layer in range(layout.num_layers):
        shards[f"layers.{layer}.self_attn.qkv_weight"] = ParamShard((128, 64), 0, ((32, 64), (80, 96), (112, 128)))
        shards[f"layers.{layer}.self_attn.o_weight"] = ParamShard((64, 64), 1, ((32, 64),))
        shards[f"layers.{layer}.mlp.gate_up_weight"] = ParamShard((256, 64), 0, ((64, 128), (192, 256)))
        shards[f"layers.{layer}.mlp.down_weight"] = ParamShard((64, 128), 1, ((64, 128),))
    local = local_blocks(layout, shards)
    assert local[(0, "qkv")] == ((0, 32), (32, 48), (48, 64)) and local[(0, "gate_up")] == ((0, 64), (64, 128))
    assert local[(0, "o")] == ((0, 64),) and local[(0, "down")] == ((0, 64),)


def test_cpu_stacks_are_rank_major(setup) -> None:
    from folio.kernels.lora_cpu import rank_major

    layout, _ = setup
    for a, b in layout.allocate(3, MAX_RANK, torch.float32).values():
        assert a.is_contiguous() and rank_major(b) and b.shape[0] == 3
