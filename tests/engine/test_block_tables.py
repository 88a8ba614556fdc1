"""The runner's persistent block tables: equal to the sequences' lists as blocks are added, freed and
reallocated, converting only what changed."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from folio.engine.block_tables import BlockTables


def item(table: list[int]) -> SimpleNamespace:
    return SimpleNamespace(seq=SimpleNamespace(block_table=table))


def expected(items: list[SimpleNamespace], lens: list[int], block_size: int) -> torch.Tensor:
    width = -(-max(lens) // block_size)
    return torch.tensor([it.seq.block_table[:width] for it in items], dtype=torch.int32)


def check(tables: BlockTables, items: list[SimpleNamespace], lens: list[int]) -> None:
    got = tables.tensor(items, lens)
    width = -(-max(lens) // tables.block_size)
    assert got.dtype == torch.int32 and got.shape == (len(items), width)
    for r, it in enumerate(items):  # entries past a sequence's context are never read: compare its own
        own = -(-lens[r] // tables.block_size)
        assert got[r, :own].tolist() == it.seq.block_table[:own]


def test_tables_follow_growth_freeing_and_reuse() -> None:
    tables = BlockTables(4, torch.device("cpu"))
    a, b = item([3, 1]), item([7])
    check(tables, [a, b], [8, 2])
    a.seq.block_table += [9, 10, 11]  # blocks added as the sequence grows
    check(tables, [b, a], [2, 19])
    a.seq.block_table = []  # freed (preempted), then given other blocks
    a.seq.block_table += [5, 6]
    check(tables, [a], [6])
    for n in range(1, 200):  # past the first mirror's and the buffer's capacity
        b.seq.block_table.append(100 + n)
        check(tables, [a, b], [6, 4 * len(b.seq.block_table)])


def test_a_step_converts_only_new_blocks() -> None:
    """256 sequences of 8k tokens (512 blocks each): the mirror is built once, then a step copies rows."""
    block_size, blocks = 16, 512
    items = [item(list(range(i, i + blocks))) for i in range(256)]
    lens = [blocks * block_size] * 256
    tables = BlockTables(block_size, torch.device("cpu"))
    tables.tensor(items, lens)
    start = time.perf_counter()
    for _ in range(5):
        got = tables.tensor(items, lens)
    per_step = (time.perf_counter() - start) / 5
    start = time.perf_counter()
    want = expected(items, lens, block_size)
    rebuilt = time.perf_counter() - start
    assert torch.equal(got, want)
    print(f"256 x 8k block tables: {per_step * 1e3:.2f} ms a step, rebuilt from lists {rebuilt * 1e3:.2f} ms")
