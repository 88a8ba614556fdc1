"""Block tables as the kernels read them, kept across steps instead of rebuilt from Python lists.

Each sequence's table is mirrored in an int32 numpy row that grows as the block manager appends blocks
(its tables only grow; freeing one replaces the list, which the mirror notices by identity), so a step
converts only the blocks added since the last one. A step's rows are laid into one persistent host buffer
(pinned on CUDA) and reach the device in a single non-blocking copy. That copy may still be pending when
the next step comes (a step that samples nothing never waits for the device), so each copy records an
event (`sent`) and the next step waits on it before rewriting the buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from folio.kernels.layout import BLOCK_TABLE_DTYPE

if TYPE_CHECKING:
    from folio.engine.scheduler import ScheduledSeq


class BlockTables:
    def __init__(self, block_size: int, device: torch.device, *, pinned: bool | None = None,
                 event: Callable[[], Any] | None = None) -> None:
        """``pinned`` and ``event`` (a ``torch.cuda.Event`` factory) default to what ``device`` has."""
        self.block_size = block_size
        self.device = device
        cuda = device.type == "cuda"
        self._pinned = cuda if pinned is None else pinned
        self._event = event if event is not None else (torch.cuda.Event if cuda else None)
        self._pending: Any = None  # the event of the last copy out of the host buffer, until waited on
        # id(seq) -> (the list mirrored (kept alive, so a new sequence at a reused id never matches it), its entries as int32, how many are mirrored)
        self._mirrors: dict[int, tuple[list[int], np.ndarray, int]] = {}
        self._host = torch.zeros(0, 0, dtype=BLOCK_TABLE_DTYPE)

    def _row(self, key: int, table: list[int]) -> np.ndarray:
        mirrored = self._mirrors.get(key)
        if mirrored is None or mirrored[0] is not table or mirrored[2] > len(table):
            mirrored = (table, np.empty(max(16, len(table)), dtype=np.int32), 0)
        _, row, count = mirrored
        if len(table) > count:
            if len(table) > row.shape[0]:
                row = np.concatenate([row[:count], np.empty(max(len(table), 2 * row.shape[0]) - count, np.int32)])
            row[count : len(table)] = table[count:]
            count = len(table)
        self._mirrors[key] = (table, row, count)
        return row[:count]

    def _buffer(self, rows: int, width: int) -> torch.Tensor:
        if self._host.shape[0] < rows or self._host.shape[1] < width:
            # zeros: entries past a sequence's table hold some valid block id (a stale one is fine, since
            # entries past a context are never read)
            shape = (max(rows, self._host.shape[0]) * 5 // 4 + 1, max(width, self._host.shape[1]) * 5 // 4 + 1)
            self._host = torch.zeros(shape, dtype=BLOCK_TABLE_DTYPE, pin_memory=self._pinned)
        return self._host

    def host(self, items: list[ScheduledSeq], lens: list[int]) -> torch.Tensor:
        """The items' block tables as int32 ``[len(items), blocks of the longest context]``, in the host
        buffer (valid until the next call).

        A caller that copies them to the device without blocking calls `sent` after: the next call waits
        for that copy before it rewrites the buffer."""
        if self._pending is not None:
            self._pending.synchronize()  # at once unless the device has not run the last copy yet
            self._pending = None
        width = -(-max(lens) // self.block_size)
        host = self._buffer(len(items), width)
        view = host.numpy()
        for r, item in enumerate(items):
            row = self._row(id(item.seq), item.seq.block_table)[:width]
            view[r, : row.shape[0]] = row
        if len(self._mirrors) > 4 * len(items) + 64:  # forget finished sequences now and then
            live = {id(item.seq) for item in items}
            self._mirrors = {k: v for k, v in self._mirrors.items() if k in live}
        return host[: len(items), :width]

    def tensor(self, items: list[ScheduledSeq], lens: list[int]) -> torch.Tensor:
        """:meth:`host`'s tables on the runner's device (one copy)."""
        out = self.host(items, lens)
        if self.device.type == "cpu":
            return out
        on_device = out.to(self.device, non_blocking=True)
        self.sent()
        return on_device

    def sent(self) -> None:
        """A non-blocking copy out of :meth:`host`'s buffer was just queued: the next step waits for it."""
        if self._event is not None:
            self._pending = self._event()
            self._pending.record()
