"""Decode graphs on the CPU: `EagerStepGraph` stands in for a CUDA graph, so the static buffers, the padding
to captured sizes and the runner's dispatch are checked here; only the capture itself needs a GPU
(tests/engine/test_gpu.py).

The stand-in re-runs the captured forward pass over the static buffers on every replay, so a buffer that
the runner forgets to refresh gives wrong tokens here just as it would under a real graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from folio.engine import LLM, SamplingParams
from folio.engine.cpu_graphs import CpuDecodeGraphs
from folio.engine.cuda_graphs import MAX_CAPTURED_BATCH, DecodeGraphs, EagerStepGraph, capture_sizes
from folio.engine.layers.context import AttentionContext
from folio.engine.model_runner import ModelRunner
from folio.engine.scheduler import ScheduledSeq

BLOCK_SIZE = 8  # small blocks: contexts cross block boundaries every few tokens


def _llm(path: Path, token_budget: int = 64) -> LLM:
    # a small token budget chunks prefills, so prefill chunks share steps with other sequences' decodes
    return LLM(str(path), block_size=BLOCK_SIZE, max_num_seqs=32, max_num_batched_tokens=token_budget)


def _use_graphs(runner: ModelRunner, max_batch_size: int | None = None) -> DecodeGraphs:
    runner.use_kernels = True  # the folio.kernels path; on CPU tensors it runs the reference twins
    runner.model.use_kernels(True)
    runner.enable_decode_graphs(graph_factory=EagerStepGraph, max_batch_size=max_batch_size)
    assert runner.decode_graphs is not None
    return runner.decode_graphs


@dataclass
class StepRecord:
    num_seqs: int
    has_prefill: bool
    has_decode: bool
    graph_rows: int | None  # rows the graphs ran (None: the step ran eagerly)


def _record_steps(runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> list[StepRecord]:
    graphs = runner.decode_graphs
    assert graphs is not None
    records: list[StepRecord] = []
    graph_rows: list[int] = []
    real_run, real_step = graphs.run, runner.step

    def run(input_ids: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        graph_rows.append(input_ids.shape[0])
        return real_run(input_ids, *rest)

    def step(batch: list[ScheduledSeq]):
        graph_rows.clear()
        result = real_step(batch)
        assert len(graph_rows) <= 1
        records.append(StepRecord(
            len(batch), any(s.num_tokens > 1 for s in batch), any(s.num_tokens == 1 for s in batch),
            graph_rows[0] if graph_rows else None,
        ))
        return result

    monkeypatch.setattr(graphs, "run", run)
    monkeypatch.setattr(runner, "step", step)
    return records


def mixed_workload(num_prompts: int) -> tuple[list[list[int]], list[SamplingParams]]:
    g = torch.Generator().manual_seed(num_prompts)
    prompts = [torch.randint(3, 512, (int(n),), generator=g).tolist()
               for n in torch.randint(1, 60, (num_prompts,), generator=g)]
    # different lengths: sequences finish at different steps, so the decode batch shrinks through many sizes
    params = [SamplingParams(temperature=0.0, max_tokens=8 + (7 * i) % 24, ignore_eos=True)
              for i in range(num_prompts)]
    return prompts, params


def test_capture_sizes() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(40) == [1, 2, 4, 8, 16, 32, 40]
    assert capture_sizes(256) == [1, 2, 4, 8, *range(16, 257, 16)]
    assert capture_sizes(10_000)[-1] == MAX_CAPTURED_BATCH
    with pytest.raises(ValueError, match="max_batch_size"):
        capture_sizes(0)


def _echo_graphs(max_batch_size: int) -> DecodeGraphs:
    """Graphs whose 'model' returns what it was given, one column per static input."""

    def forward(ids: torch.Tensor, pos: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        assert ctx.use_kernels and not ctx.prefills and ctx.max_context_len == 64
        assert ctx.block_tables is not None and ctx.context_lens is not None
        cols = [ids, pos, ctx.slot_mapping, ctx.context_lens, ctx.block_tables[:, 0], ctx.block_tables[:, 1]]
        return torch.stack([c.double() for c in cols], dim=1)

    return DecodeGraphs(forward, max_batch_size=max_batch_size, max_model_len=64, block_size=BLOCK_SIZE,
                        device=torch.device("cpu"), graph_factory=EagerStepGraph)


def test_run_picks_the_smallest_captured_size_and_pads() -> None:
    graphs = _echo_graphs(20)
    assert graphs.sizes == [1, 2, 4, 8, 16, 20]
    assert graphs.buffers.block_tables.shape == (20, 64 // BLOCK_SIZE)
    assert [graphs.size_for(n) for n in (1, 3, 5, 8, 9, 17, 20, 21)] == [1, 4, 8, 8, 16, 20, 20, None]

    def run(n: int, base: int) -> torch.Tensor:
        rows = torch.arange(n) + base
        tables = torch.stack([rows, rows + 1], dim=1).to(torch.int32)
        return graphs.run(rows, rows + 1, rows * BLOCK_SIZE, tables, (rows % 7 + 1).to(torch.int32))

    run(8, 100)  # fills every row of the size-8 graph with real values
    out = run(5, 200)
    assert out.shape == (5, 6)
    rows = torch.arange(5).double() + 200
    assert torch.equal(out, torch.stack([rows, rows + 1, rows * BLOCK_SIZE, rows % 7 + 1, rows, rows + 1], 1))
    # rows 5..7 (padding of the size-8 graph) were reset, not left from the previous step
    padded = graphs._outputs[8][5:8]
    assert padded[:, :4].tolist() == [[0, 0, -1, 1]] * 3
    with pytest.raises(ValueError, match="no captured graph"):
        run(21, 0)


def test_padded_rows_never_write_the_kv_cache(tiny_variant) -> None:
    runner = _llm(tiny_variant("llama-gqa3-tied")).llm_engine.runner
    check_padding_writes_no_kv(runner, _use_graphs(runner, max_batch_size=8))


def check_padding_writes_no_kv(runner: ModelRunner, graphs: DecodeGraphs) -> None:
    """Decode steps that fill a graph's rows, then leave one as padding: only the real slots change.
    (Also run on CUDA with captured graphs, by test_gpu.py; needs block_size == BLOCK_SIZE.)"""
    assert runner.block_size == BLOCK_SIZE and graphs.size_for(3) == 4
    for k, v in runner.kv_caches:  # distinct contents everywhere, so any stray write shows
        k.normal_()
        v.normal_()

    def decode(blocks: list[int], position: int) -> None:
        n = len(blocks)
        slots = torch.tensor([b * BLOCK_SIZE + position for b in blocks])
        tables = torch.tensor(blocks, dtype=torch.int32)[:, None]
        graphs.run(torch.arange(n) + 5, torch.full((n,), position), slots, tables,
                   torch.full((n,), position + 1, dtype=torch.int32))

    decode([1, 2, 3, 4], position=3)  # fills the size-4 graph's rows; a stale row 3 would write slot 4*8+3
    before = [(k.clone(), v.clone()) for k, v in runner.kv_caches]
    decode([5, 6, 7], position=2)  # 3 sequences: the size-4 graph with one padding row
    written = {5 * BLOCK_SIZE + 2, 6 * BLOCK_SIZE + 2, 7 * BLOCK_SIZE + 2}
    for (k0, v0), (k, v) in zip(before, runner.kv_caches, strict=True):
        for old, new in ((k0, k), (v0, v)):
            changed = (old != new).flatten(2).any(-1).flatten().nonzero().flatten().cpu().tolist()
            assert set(changed) == written


def test_cpu_engine_records_cpu_graphs_and_cuda_graphs_need_the_kernel_path(tiny_variant) -> None:
    path = tiny_variant("llama-gqa3-tied")
    runner = _llm(path).llm_engine.runner
    assert isinstance(runner.decode_graphs, CpuDecodeGraphs)  # CPU: step graphs (folio.engine.cpu_graphs)
    assert LLM(str(path), enforce_eager=True).llm_engine.runner.decode_graphs is None
    with pytest.raises(ValueError, match="kernel path"):
        runner.enable_decode_graphs(graph_factory=EagerStepGraph)


# (prompts, largest graph (None: max_num_seqs), token budget): a budget that both mixes prefill chunks with
# decodes and, for 17 prompts, prefills them all before the first finishes (a decode step of 17)
@pytest.mark.parametrize(
    ("num_prompts", "max_batch_size", "token_budget"), [(3, None, 24), (5, None, 24), (17, None, 96), (17, 8, 96)]
)
def test_graphs_give_the_plain_cpu_path_tokens(
    tiny_variant, monkeypatch: pytest.MonkeyPatch, num_prompts: int, max_batch_size: int | None, token_budget: int
) -> None:
    llm = _llm(tiny_variant("llama-gqa3-tied"), token_budget)
    prompts, params = mixed_workload(num_prompts)
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    llm.llm_engine.block_manager.reset_prefix_cache()  # prefill again, mixed with decodes as before
    graphs = _use_graphs(llm.llm_engine.runner, max_batch_size)
    records = _record_steps(llm.llm_engine.runner, monkeypatch)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == expected

    for r in records:  # graphs exactly for the decode-only steps that fit; mixed steps ran eagerly
        fits = r.has_decode and not r.has_prefill and r.num_seqs <= graphs.max_batch_size
        assert r.graph_rows == (r.num_seqs if fits else None), r
    assert any(r.has_prefill and r.has_decode for r in records)
    replayed = {r.graph_rows for r in records if r.graph_rows is not None}
    assert replayed - set(graphs.sizes), "no step padded its batch to a captured size"
    assert max(r.num_seqs for r in records if not r.has_prefill) == num_prompts
    if max_batch_size is not None:
        assert any(r.graph_rows is None and not r.has_prefill for r in records), "no decode step too big"
