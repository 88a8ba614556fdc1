"""The paged KV cache's bookkeeping: a pool of fixed-size blocks with reference counts and a prefix cache.

A full block is found by its key: its parent's serial (the number its parent got when registered, never
given twice) and its own tokens. Keys compare exactly, so a prefix matches only where every block before
it did, whatever their hashes; a block evicted and refilled gets a new serial, which its old children's
keys no longer name. Blocks whose last user is gone keep their contents and key and sit in an LRU list: a
later request with the same prefix takes them back, and the least recently freed one is the first to be
overwritten when memory runs out.
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict, deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from folio.engine.sequence import Sequence


def block_key(parent: int | None, token_ids: tuple[int, ...]) -> Hashable:
    """A full block's cache key: its parent's serial (for a prompt's first block its sequence's
    ``cache_root``: None for the base model, negative per adapter) and its tokens."""
    return (parent, token_ids)


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    key: Hashable | None = None  # set once the block is full, computed and registered in the cache
    serial: int = 0  # this registration's number (0: not registered)
    token_ids: tuple[int, ...] = field(default=())


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free_empty: deque[int] = deque(range(num_blocks))  # free, no cached contents
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # free, cached contents, LRU first
        self._cached: dict[Hashable, int] = {}  # key -> block
        self._serials = itertools.count(1)

    # --- capacity -----------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_empty) + len(self._free_cached)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- prefix cache -------------------------------------------------------------------------------

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Blocks already holding a prefix of ``seq``'s tokens (at most all but its last token, which has
        to be computed to get logits)."""
        if not self.enable_prefix_caching:
            return []
        found: list[int] = []
        parent = seq.cache_root
        bs = self.block_size
        for i in range((len(seq) - 1) // bs):
            block_id = self._cached.get(block_key(parent, tuple(seq.token_ids[i * bs : (i + 1) * bs])))
            if block_id is None:
                break
            found.append(block_id)
            parent = self.blocks[block_id].serial
        return found

    def register_full_blocks(self, seq: Sequence) -> None:
        """Put ``seq``'s newly full and computed blocks into the prefix cache."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        parent = seq.block_serials[-1] if seq.block_serials else seq.cache_root
        for i in range(len(seq.block_serials), seq.num_computed_tokens // bs):
            tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            key = block_key(parent, tokens)
            block = self.blocks[seq.block_table[i]]
            # A block taken from the cache is registered already; a fresh one is now, unless a block of
            # this key is (then this one simply stays private, and its children follow the registered one).
            registered = self._cached.get(key)
            if block.key is None and registered is None:
                block.key, block.serial, block.token_ids = key, next(self._serials), tokens
                self._cached[key] = block.block_id
                registered = block.block_id
            parent = self.blocks[block.block_id if registered is None else registered].serial
            seq.block_serials.append(parent)

    # --- allocation ---------------------------------------------------------------------------------

    def allocate(self, seq: Sequence, num_new_tokens: int, cached_blocks: list[int] | None = None) -> bool:
        """Make ``seq``'s block table cover its computed tokens plus ``num_new_tokens``.

        ``cached_blocks`` (from :meth:`find_cached_prefix`, only for a sequence without blocks) become the
        head of its table. Returns False, changing nothing, when there are not enough free blocks.
        """
        cached_blocks = cached_blocks or []
        if cached_blocks and seq.block_table:
            raise RuntimeError("cached prefix blocks can only start a sequence's block table")
        have = len(seq.block_table) + len(cached_blocks)
        num_tokens = max(seq.num_computed_tokens, len(cached_blocks) * self.block_size) + num_new_tokens
        new = max(self.blocks_needed(num_tokens) - have, 0)
        revived = sum(1 for b in cached_blocks if self.blocks[b].ref_count == 0)
        if new + revived > self.num_free_blocks:
            return False
        for b in cached_blocks:
            block = self.blocks[b]
            if block.ref_count == 0:
                del self._free_cached[b]
            block.ref_count += 1
            seq.block_table.append(b)
            seq.block_serials.append(block.serial)
        for _ in range(new):
            seq.block_table.append(self._take_free_block())
        return True

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Frees ``seq``'s blocks past those holding its first ``num_tokens`` tokens (the slots of refused
        proposals): blocks of this step, never registered, so they go back empty."""
        keep = self.blocks_needed(num_tokens)
        if len(seq.block_table) <= keep:
            return
        for block_id in seq.block_table[keep:]:
            block = self.blocks[block_id]
            assert block.ref_count == 1 and block.key is None, "a trimmed block is the sequence's own and unregistered"
            block.ref_count = 0
            self._free_empty.append(block_id)
        # a new list, never the old one shortened: block tables' mirrors (`BlockTables`) take a table that is
        # the same list as one that only grew
        seq.block_table = seq.block_table[:keep]

    def check(self, seqs: Iterable[Sequence]) -> None:
        """Asserts the pool's invariants, given every sequence holding blocks (tests call it after steps):
        each block is free or referenced, never both, by as many tables as its count says; free lists hold
        no block twice; a registered block is found under its key unless a twin of its key is."""
        refs = Counter(b for seq in seqs for b in seq.block_table)
        listed = [*self._free_empty, *self._free_cached]
        free = set(listed)
        assert len(listed) == len(free), "a block is free twice"
        for block in self.blocks:
            assert block.ref_count == refs.get(block.block_id, 0), (block, refs.get(block.block_id, 0))
            assert (block.block_id in free) == (block.ref_count == 0), block
            assert (block.block_id in self._free_cached) <= (block.key is not None), block
        for key, block_id in self._cached.items():
            assert self.blocks[block_id].key == key, (key, self.blocks[block_id])

    def _take_free_block(self) -> int:
        if self._free_empty:
            block_id = self._free_empty.popleft()
        else:
            block_id, _ = self._free_cached.popitem(last=False)  # evict the least recently used
            block = self.blocks[block_id]
            self._forget(block)
        self.blocks[block_id].ref_count = 1
        return block_id

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references; blocks nobody uses become free (cached ones stay findable)."""
        # Reversed, so that a sequence's tail blocks (the least shareable) are evicted first.
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.key is not None:
                    self._free_cached[block_id] = None
                else:
                    self._free_empty.append(block_id)
        seq.block_table = []
        seq.block_serials = []

    def reset_prefix_cache(self) -> None:
        while self._free_cached:
            block_id, _ = self._free_cached.popitem(last=False)
            block = self.blocks[block_id]
            self._forget(block)
            self._free_empty.append(block_id)

    def _forget(self, block: Block) -> None:
        """Takes ``block`` out of the prefix cache; its serial is never given again."""
        if self._cached.get(block.key) == block.block_id:
            del self._cached[block.key]
        block.key, block.serial, block.token_ids = None, 0, ()
