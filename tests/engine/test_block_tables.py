"""The runner's persistent block tables: equal to the sequences' lists as blocks are added, freed and
reallocated, converting only what changed."""

from __future__ import annotations

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
    """256 sequences of 8k tokens (512 blocks each): each mirror is built once, then steps reuse it and a new
    block converts one entry."""
    block_size, blocks = 16, 512
    items = [item(list(range(i, i + blocks))) for i in range(256)]
    lens = [blocks * block_size] * 256
    tables = BlockTables(block_size, torch.device("cpu"))
    tables.tensor(items, lens)
    rows = {key: row for key, (_, row, _) in tables._mirrors.items()}
    for _ in range(3):
        got = tables.tensor(items, lens)
    assert torch.equal(got, expected(items, lens, block_size))
    assert all(tables._mirrors[key][1] is row for key, row in rows.items())  # nothing rebuilt
    items[0].seq.block_table.append(9999)
    check(tables, items, [lens[0] + block_size, *lens[1:]])
    assert tables._mirrors[id(items[0].seq)][2] == blocks + 1


def test_finished_sequences_are_forgotten() -> None:
    tables = BlockTables(4, torch.device("cpu"))
    live = [item([1, 2])]
    for n in range(200):  # sequences that come and go
        check(tables, [*live, item([n])], [8, 4])
    assert len(tables._mirrors) <= 4 * 2 + 64 + 1
    assert id(live[0].seq) in tables._mirrors


def test_a_step_waits_for_the_last_copy_before_it_rewrites_the_buffer() -> None:
    # as on CUDA: each non-blocking copy out of the host buffer records an event, and the next step's
    # tables are written only once that event is waited on (here: the buffer still holds the last step's)
    log: list[object] = []

    class Event:
        def record(self) -> None:
            log.append("recorded")

        def synchronize(self) -> None:
            log.append(("waited", tables._host[0, :2].tolist()))

    tables = BlockTables(4, torch.device("cuda"), pinned=False, event=Event)
    first = tables.host([item([3, 1])], [8])
    assert first.tolist() == [[3, 1]] and log == []  # nothing copied yet: nothing to wait for
    tables.sent()
    second = tables.host([item([7, 8])], [8])
    assert log == ["recorded", ("waited", [3, 1])] and second.tolist() == [[7, 8]]
    tables.host([item([9, 9])], [8])  # waited on once: no copy since, no wait
    assert len(log) == 2
