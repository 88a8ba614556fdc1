"""Block manager invariants under random allocate / append / free sequences (hypothesis)."""

from __future__ import annotations

from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

import folio.engine.block_manager as bm_module
from folio.engine.block_manager import BlockManager
from folio.engine.sampling_params import SamplingParams
from folio.engine.sequence import Sequence

BLOCK_SIZE = 4
NUM_BLOCKS = 24
# a 3-token alphabet makes equal prefixes (and so cache hits) common
tokens = st.lists(st.integers(0, 2), min_size=1, max_size=30)


def new_seq(token_ids: list[int]) -> Sequence:
    return Sequence("r", None, token_ids, SamplingParams(), 10_000, frozenset())


class BlockManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
        self.live: list[Sequence] = []

    seqs = Bundle("seqs")

    def _compute(self, seq: Sequence, n: int) -> None:
        """What a model step does: n more tokens now have K/V in the cache."""
        seq.num_computed_tokens += n
        self.bm.register_full_blocks(seq)

    @rule(target=seqs, prompt=tokens)
    def add(self, prompt: list[int]):
        seq = new_seq(prompt)
        cached = self.bm.find_cached_prefix(seq)
        for i, block_id in enumerate(cached):  # a hit only for exactly equal tokens
            assert self.bm.blocks[block_id].token_ids == tuple(prompt[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
        assert len(cached) * BLOCK_SIZE < len(prompt)  # the last token is always computed
        free_before = self.bm.num_free_blocks
        if not self.bm.allocate(seq, len(prompt) - len(cached) * BLOCK_SIZE, cached):
            assert seq.block_table == [] and self.bm.num_free_blocks == free_before
            return None
        seq.num_computed_tokens = len(cached) * BLOCK_SIZE
        self._compute(seq, len(prompt) - seq.num_computed_tokens)
        self.live.append(seq)
        return seq

    @rule(seq=seqs, token=st.integers(0, 2))
    def append(self, seq: Sequence | None, token: int) -> None:
        if seq is None or seq not in self.live:
            return
        seq.token_ids.append(token)
        table = list(seq.block_table)
        if self.bm.allocate(seq, 1):
            self._compute(seq, 1)
        else:
            seq.token_ids.pop()
            assert seq.block_table == table

    @rule(seq=consumes(seqs))
    def free(self, seq: Sequence | None) -> None:
        if seq is None or seq not in self.live:
            return
        self.live.remove(seq)
        self.bm.free(seq)
        assert seq.block_table == []

    @invariant()
    def refcounts_match_tables(self) -> None:
        uses = Counter(b for s in self.live for b in s.block_table)
        for block in self.bm.blocks:
            assert block.ref_count == uses[block.block_id]

    @invariant()
    def no_block_leaked(self) -> None:
        free = list(self.bm._free_empty) + list(self.bm._free_cached)
        assert len(free) == len(set(free)) == self.bm.num_free_blocks
        assert set(free) == {b.block_id for b in self.bm.blocks if b.ref_count == 0}

    @invariant()
    def tables_cover_computed_tokens(self) -> None:
        for s in self.live:
            assert len(s.block_table) == self.bm.blocks_needed(s.num_computed_tokens)
            assert len(set(s.block_table)) == len(s.block_table)

    @invariant()
    def cache_index_consistent(self) -> None:
        for key, block_id in self.bm._cached.items():
            assert self.bm.blocks[block_id].key == key and self.bm.blocks[block_id].serial > 0
        serials = [b.serial for b in self.bm.blocks if b.key is not None]
        assert len(set(serials)) == len(serials)
        for block in self.bm.blocks:
            if block.key is not None:
                assert len(block.token_ids) == BLOCK_SIZE


class CollidingKey:
    """A cache key whose hash is the same for every block: only equality tells keys apart."""

    def __init__(self, key: object) -> None:
        self.key = key

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CollidingKey) and self.key == other.key


class CollidingHashMachine(BlockManagerMachine):
    """Every block hashes alike: a prefix of equal blocks (a run of one token) must not find the same
    cached block twice, nor a block whose parent differs."""

    def __init__(self) -> None:
        self._real_key = bm_module.block_key
        bm_module.block_key = lambda parent, token_ids: CollidingKey(self._real_key(parent, token_ids))
        super().__init__()

    def teardown(self) -> None:
        bm_module.block_key = self._real_key


TestBlockManager = BlockManagerMachine.TestCase
TestBlockManager.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestCollidingHashes = CollidingHashMachine.TestCase
TestCollidingHashes.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


def test_cached_blocks_are_reused_lru_first() -> None:
    bm = BlockManager(4, BLOCK_SIZE)
    a, b = new_seq([1] * 8), new_seq([2] * 8)
    for s in (a, b):
        assert bm.allocate(s, 8)
        s.num_computed_tokens = 8
        bm.register_full_blocks(s)
    assert bm.num_free_blocks == 0 and not bm.allocate(new_seq([3]), 1)
    a_blocks, b_blocks = list(a.block_table), list(b.block_table)
    bm.free(a)
    bm.free(b)
    # a's full blocks were freed first, so they are evicted first; b's prefix survives
    c = new_seq([3] * 5)
    assert bm.allocate(c, 5)
    assert set(c.block_table) == set(a_blocks[:2])
    assert bm.find_cached_prefix(new_seq([2] * 9)) == b_blocks[:2]
    assert bm.find_cached_prefix(new_seq([1] * 9)) == []


def test_a_prefix_of_equal_blocks_finds_each_block_once() -> None:
    """Blocks of equal tokens at different depths are different prefixes (the collision the state machine
    above once found: a run of 9 equal tokens came back with one cached block at both depths)."""
    bm = BlockManager(8, BLOCK_SIZE)
    a = new_seq([0] * 4)
    assert bm.allocate(a, 4)
    a.num_computed_tokens = 4
    bm.register_full_blocks(a)
    first = a.block_table[0]
    bm.free(a)
    assert bm.find_cached_prefix(new_seq([0] * 9)) == [first]  # not [first, first]
    b = new_seq([0] * 9)
    cached = bm.find_cached_prefix(b)
    assert bm.allocate(b, 5, cached)
    b.num_computed_tokens = 9
    bm.register_full_blocks(b)
    assert len(set(b.block_table)) == 3
    assert bm.find_cached_prefix(new_seq([0] * 13)) == b.block_table[:2]
