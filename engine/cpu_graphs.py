"""CPU step graphs for decode steps: a forward pass recorded once per batch size, replayed without its Python.

On the CPU a small model's decode step spends milliseconds between its kernels: SmolLM2's 30 layers make
about 190 native kernel calls and 400 tensor allocations and views a step, 3.8 ms of Python in the 27 ms
forward pass of 8 sequences (bench/README.md, "CPU step graphs"). As with CUDA graphs (`folio.engine.cuda_graphs`),
a decode step's work depends on its batch size, not on its values, so it is recorded once and replayed:

- the native kernels' calls (data pointers and sizes) come from `folio.kernels.recording`;
- PyTorch ops are seen by a dispatch mode while the pass runs: views need nothing, in-place ops (a cache
  write, ``out[a:b] = x``) run again as they are, and any other op runs again into the output it gave
  the first time;
- an op whose result the Python around it could act on (``.item()``, a random draw) cannot be replayed:
  recording raises `NotReplayable` and that batch size keeps running eagerly.

The pass's tensors then move into one arena that all graphs share (they never run at once, and a step's
output is used before the next step), laid out by liveness as an allocator would reuse them: a tensor
takes memory that no later step of the pass reads, so a graph holds about one layer's temporaries and
they stay in cache, as eager steps' do. The recorded pointers are moved with them.

Unlike a CUDA graph, a CPU graph is recorded lazily, by a step of its size (whose result it is), and for
every size exactly: padding a batch would add real work. A recording costs about two steps and some tens
of milliseconds, so a size is recorded once it has run `RECORD_AFTER` times (a server's batch sizes
recur; the tail of an offline batch shrinks through each size once or twice). When a recording needs more
arena than there is, the arena grows and the graphs laid out in the old one are recorded again on their
next use.
"""

from __future__ import annotations

import bisect
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from folio.engine.cuda_graphs import DecodeBuffers, Forward
from folio.engine.layers.context import AttentionContext
from folio.engine.layers.lora import LoRAContext
from folio.kernels.recording import NativeCall, NotReplayable, recording

log = logging.getLogger(__name__)

# The largest decode batch recorded (a step's Python is still 3-4% of a 64-sequence step of SmolLM2).
MAX_RECORDED_BATCH = 256
# The most memory the graphs' arena takes: a batch size whose pass needs more runs eagerly.
MAX_ARENA_BYTES = 256 << 20
RECORD_AFTER = 4  # eager steps of a batch size before its step is recorded
_ALIGN = 64  # bytes: each tensor starts on a cache line
_ALLOCATIONS = frozenset({torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
                          torch.ops.aten.empty_strided.default})  # fmt: skip


def _extent(t: torch.Tensor) -> int:
    """The bytes from ``t``'s first element to just past its last."""
    if t.numel() == 0:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))) * t.element_size()


class Arena:
    """The memory every graph's tensors live in; ``generation`` counts its reallocations."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.generation = 0

    def reserve(self, nbytes: int) -> None:
        """At least ``nbytes``; a new buffer (a new generation) at least twice the old one's size, up to
        `MAX_ARENA_BYTES`."""
        if nbytes > self.buffer.numel():
            self.buffer = torch.empty(max(nbytes, min(2 * self.buffer.numel(), MAX_ARENA_BYTES)), dtype=torch.uint8)
            self.generation += 1

    def view(self, offset: int, like: torch.Tensor) -> torch.Tensor:
        """``like``'s shape, strides and dtype at byte ``offset``."""
        return self.buffer[offset : offset + _extent(like)].view(like.dtype).as_strided(like.shape, like.stride())


@dataclass
class _Allocation:
    start: int  # its address while the pass was recorded
    nbytes: int
    first: int  # the index of the first step that may write it
    last: int = -1  # the last step that reads or writes it
    offset: int = 0  # its place in the arena


def _run_into(outputs: tuple[torch.Tensor, ...], func: Any, *args: Any, **kwargs: Any) -> None:
    fresh = func(*args, **kwargs)
    for out, new in zip(outputs, fresh if isinstance(fresh, (list, tuple)) else (fresh,), strict=True):
        out.copy_(new)


def _storages(values: Any) -> set[int]:
    """The storages of the tensors among ``values`` (oneDNN's packed weights have none to alias)."""
    values = values if isinstance(values, (list, tuple)) else (values,)
    return {v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor) and not v.is_mkldnn}


class _Recorder(TorchDispatchMode):
    """Sees every PyTorch op of the recorded pass; keeps what replay must run again, in order, in ``steps``
    (shared with the native calls' recording), and where and when the pass allocated each tensor. The
    tensors themselves go as the pass drops them, as in an eager step, so an address may serve several."""

    def __init__(self, steps: list[NativeCall]) -> None:
        super().__init__()
        self.steps = steps
        self.allocations: list[_Allocation] = []

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Nothing records under torch.compile, so the handler needs no torch._dynamo.disable wrapper, whose
        # first call imports torch._dynamo (1.7 s and 140 MiB here).
        return False

    def _new(self, t: torch.Tensor) -> torch.Tensor:
        self.allocations.append(_Allocation(t.data_ptr(), max(_extent(t), 1), len(self.steps)))
        return t

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _ALLOCATIONS:
            return self._new(func(*args, **kwargs))
        if torch.Tag.nondeterministic_seeded in func.tags:
            raise NotReplayable(f"{func} draws random numbers")
        out = func(*args, **kwargs)
        outputs = out if isinstance(out, (list, tuple)) else (out,)
        if not all(isinstance(o, torch.Tensor) for o in outputs):
            raise NotReplayable(f"{func} returns {type(out).__name__}: a value the Python around it may act on")
        if any(a.alias_info is not None and a.alias_info.is_write for a in func._schema.arguments):
            self.steps.append((functools.partial(func, **kwargs), args))  # in place: again, on the same tensors
            return out
        inputs = _storages(args) | _storages(list(kwargs.values()))
        if all(o.untyped_storage().data_ptr() in inputs for o in outputs):
            return out  # a view of an input: no data of its own
        kept = tuple(self._new(o) for o in outputs)
        self.steps.append((functools.partial(_run_into, kept, func, **kwargs), args))
        return out


def _map(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` rebuilt with ``leaf`` applied to each pointer, tensor or other leaf, in a fixed order."""
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, leaf) for v in value)
    if isinstance(value, dict):
        return {k: _map(v, leaf) for k, v in value.items()}
    if isinstance(value, functools.partial):
        return functools.partial(value.func, *_map(value.args, leaf), **_map(value.keywords, leaf))
    return leaf(value)


def _address(value: Any) -> int | None:
    if isinstance(value, torch.Tensor):
        return None if value.is_mkldnn else value.data_ptr()
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Layout:
    """Where each allocation of a recording goes in the arena, and the recorded steps moved there.

    A pointer (or tensor) of step i belongs to the allocation that held its address at step i: the latest
    one allocated there by then (an earlier one at that address was freed before it came)."""

    def __init__(self, allocations: list[_Allocation], steps: list[NativeCall], out: torch.Tensor) -> None:
        self.allocations = sorted(allocations, key=lambda a: a.first)  # stable: allocation order
        self._steps: list[Any] = [*steps, out]  # the output: read after the last step
        self._owners: list[list[_Allocation | None]] = []
        starts: list[int] = []  # the allocations live at the current step, by address
        owners: list[_Allocation] = []
        k = 0
        for i, step in enumerate(self._steps):
            while k < len(self.allocations) and self.allocations[k].first <= i:
                _insert(starts, owners, self.allocations[k])
                k += 1
            resolved: list[_Allocation | None] = []

            def resolve(value: Any, i: int = i, resolved: list[_Allocation | None] = resolved) -> Any:
                address, owner = _address(value), None
                if address is not None:
                    j = bisect.bisect_right(starts, address) - 1
                    if j >= 0 and address < starts[j] + owners[j].nbytes:
                        owner = owners[j]
                        owner.last = i
                resolved.append(owner)
                return value

            _map(step, resolve)
            self._owners.append(resolved)
        assert self._owners[-1][0] is not None, "the recorded pass must return a tensor it allocated"
        self.nbytes = self._place()

    def _place(self) -> int:
        """First fit in allocation order, reusing what no later step touches; the bytes needed."""
        live: list[tuple[int, int, int]] = []  # (offset, end, last step)
        top = 0
        for a in self.allocations:
            live = [(o, e, last) for o, e, last in live if last >= a.first]
            size = -(-a.nbytes // _ALIGN) * _ALIGN
            offset = 0
            for o, e, _ in sorted(live):
                if offset + size <= o:
                    break
                offset = max(offset, e)
            a.offset = offset
            live.append((offset, offset + size, max(a.last, a.first)))
            top = max(top, offset + size)
        return top

    def moved(self, arena: Arena) -> tuple[list[NativeCall], torch.Tensor]:
        """The steps and the output with their pointers and tensors moved into ``arena``."""
        base = arena.buffer.data_ptr()
        moved = []
        for step, owners in zip(self._steps, self._owners, strict=True):
            found = iter(owners)

            def move(value: Any, found: Any = found) -> Any:
                a = next(found)
                if a is None:
                    return value
                if isinstance(value, int):
                    return base + a.offset + (value - a.start)
                return arena.view(a.offset + (value.data_ptr() - a.start), value)

            moved.append(_map(step, move))
        return moved[:-1], moved[-1]


def _insert(starts: list[int], owners: list[_Allocation], a: _Allocation) -> None:
    """Adds ``a`` to the live map, dropping the allocations it overlaps (freed before it came)."""
    j = bisect.bisect_left(starts, a.start)
    if j > 0 and starts[j - 1] + owners[j - 1].nbytes > a.start:
        j -= 1
    k = j
    while k < len(starts) and starts[k] < a.start + a.nbytes:
        k += 1
    starts[j:k] = [a.start]
    owners[j:k] = [a]


class CpuStepGraph:
    """A recorded CPU forward pass (the `folio.engine.cuda_graphs.StepGraph` protocol), laid out in
    ``arena``; ``generation`` is the arena's when it was laid out."""

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.generation = -1
        self.nbytes = 0  # the arena bytes it needs
        self._steps: list[NativeCall] = []

    def capture(self, fn: Callable[[], torch.Tensor], *, headroom: float = 1.0) -> torch.Tensor:
        """Runs ``fn`` (which reads only static buffers) once, recording it, then moves its tensors into
        the arena (grown, if it must, to ``headroom`` times this graph's need) and replays it there;
        returns its output, in the arena. Raises `NotReplayable` if some op of it cannot be replayed."""
        steps: list[NativeCall] = []  # the native calls and the ops, in the order they ran
        recorder = _Recorder(steps)
        with recording(steps), recorder:
            out = fn()
        layout = _Layout(recorder.allocations, steps, out)
        del steps, out  # the recording's tensors go; the arena takes over
        self.nbytes = layout.nbytes
        if self.nbytes > MAX_ARENA_BYTES:
            raise NotReplayable(f"its tensors need {self.nbytes / 2**20:.0f} MiB of arena")
        if self.nbytes > self.arena.buffer.numel():
            self.arena.reserve(min(int(self.nbytes * headroom), MAX_ARENA_BYTES))
        self.generation = self.arena.generation
        self._steps, out = layout.moved(self.arena)
        self.replay()  # the result again, computed where the replays will compute it
        return out

    def replay(self) -> None:
        for fn, args in self._steps:
            fn(*args)


class CpuDecodeGraphs:
    """Recorded CPU decode forward passes, one per batch size up to ``max_batch_size``, and their buffers.

    ``run`` takes a decode-only step (one new token per sequence) and returns its hidden states; the LM head
    and sampling stay outside the graphs, as with `folio.engine.cuda_graphs.DecodeGraphs`.
    """

    def __init__(
        self, forward: Forward, *, max_batch_size: int, max_model_len: int, block_size: int,
        lora: bool = False,
    ) -> None:
        """``lora``: the model has adapter stacks (passes with adapter rows run their ops)."""
        self.max_batch_size = min(max_batch_size, MAX_RECORDED_BATCH)
        self.buffers = DecodeBuffers(self.max_batch_size, max_model_len, block_size, torch.device("cpu"), lora=lora)
        self._forward = forward
        self.arena = Arena()
        # per (batch size, whether it has adapter tokens): a base-model step pays nothing for LoRA
        self._graphs: dict[tuple[int, bool], tuple[CpuStepGraph, torch.Tensor]] = {}
        self._eager: set[tuple[int, bool]] = set()  # passes that cannot be recorded
        self._runs: dict[tuple[int, bool], int] = {}  # eager steps per pass not recorded yet
        self.recordings = 0  # how many passes were recorded (the tests read it)

    def _context(self, n: int, lora: bool) -> AttentionContext:
        """The native CPU decode path's context over the static buffers: the rows' own block tables, read
        in place; every pass allows the buffers' full width of context. With ``lora``, the rows' adapter
        slots through the fixed-shape LoRA ops, so any mix of adapters replays."""
        b = self.buffers
        ctx = AttentionContext(
            slot_mapping=b.slot_mapping[:n], prefills=[], num_prefill_tokens=0,
            decode_block_tables=b.block_tables[:n], decode_context_lens=b.context_lens[:n],
        )  # fmt: skip
        if lora:
            assert b.lora_slots is not None
            ctx.lora = LoRAContext.for_graph(b.lora_slots[:n])
        return ctx

    def _pass(self, key: tuple[int, bool]) -> torch.Tensor:
        n, lora = key
        return self._forward(self.buffers.input_ids[:n], self.buffers.positions[:n], self._context(n, lora))

    def _record(self, key: tuple[int, bool]) -> torch.Tensor:
        graph = CpuStepGraph(self.arena)
        try:
            # an arena for the largest batch at once, as the passes grow about linearly with the batch
            out = graph.capture(functools.partial(self._pass, key), headroom=self.max_batch_size / key[0])
        except NotReplayable as exc:
            log.info("decode steps of %d sequences%s run eagerly: %s", key[0], " with adapters" * key[1], exc)
            self._eager.add(key)
            return self._pass(key)  # the recording may have stopped part way: this step runs again, eagerly
        self.recordings += 1
        self._graphs[key] = (graph, out)
        return out

    @torch.inference_mode()
    def run(self, *step: torch.Tensor | None) -> torch.Tensor:
        """Hidden states [n, hidden] of one decode step, from its inputs as `DecodeBuffers.load` takes them
        (the adapter slots None for a base-model step); valid until the next ``run``."""
        assert step[0] is not None
        n = step[0].shape[0]
        if not 0 < n <= self.max_batch_size:
            raise ValueError(f"a decode step of {n} sequences has no CPU graph (1..{self.max_batch_size})")
        self.buffers.load(*step)
        key = (n, len(step) > 5 and step[5] is not None)
        recorded = self._graphs.get(key)
        if recorded is None or recorded[0].generation != self.arena.generation:  # none, or in an old arena
            runs = self._runs[key] = self._runs.get(key, 0) + 1
            if key in self._eager or runs <= RECORD_AFTER:
                return self._pass(key)
            return self._record(key)
        graph, out = recorded
        graph.replay()
        return out
