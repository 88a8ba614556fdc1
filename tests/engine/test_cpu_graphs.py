"""CPU step graphs (`folio.engine.cpu_graphs`): a replay must compute what the recorded function computes
on the buffers' current values, bit for bit, and work that cannot be replayed must be refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from folio.engine import LLM, SamplingParams
from folio.engine import cpu_graphs as cpu_graphs_module
from folio.engine.cpu_graphs import Arena, CpuDecodeGraphs, CpuStepGraph
from folio.engine.layers.context import AttentionContext
from folio.kernels import fused_cpu
from folio.kernels.recording import NotReplayable
from tests.engine.test_cuda_graphs import mixed_workload


def _layer_like(table: torch.Tensor, ids: torch.Tensor, weight: torch.Tensor):
    """A lookup (a PyTorch op into a new tensor), a native kernel (by data pointers), an allocation filled
    by in-place writes through views: each kind of work a recorded pass holds."""

    def fn() -> torch.Tensor:
        x = torch.index_select(table, 0, ids)
        normed = fused_cpu.rms_norm(x, weight, 1e-6) if fused_cpu.supports(x) else x * weight
        out = torch.empty_like(normed)
        out[:2] = normed[:2] + 1.0
        out[2:] = normed[2:]
        return out

    return fn


@torch.inference_mode()
def test_replay_computes_what_the_function_computes_on_the_new_inputs() -> None:
    g = torch.Generator().manual_seed(0)
    table, weight = torch.randn(50, 64, generator=g), torch.randn(64, generator=g)
    ids = torch.tensor([3, 1, 4, 1, 5])
    fn = _layer_like(table, ids, weight)
    graph = CpuStepGraph(Arena())
    out = graph.capture(fn)
    assert torch.equal(out, fn())
    for values in ([9, 2, 6, 5, 3], [0, 0, 49, 7, 7]):
        ids.copy_(torch.tensor(values))
        graph.replay()
        assert torch.equal(out, fn())  # bit for bit: the same kernels on the same memory


@torch.inference_mode()
def test_what_replay_would_freeze_is_not_replayable() -> None:
    x = torch.ones(4)
    with pytest.raises(NotReplayable, match="random"):
        CpuStepGraph(Arena()).capture(lambda: x + torch.rand(4))
    with pytest.raises(NotReplayable, match="returns"):
        CpuStepGraph(Arena()).capture(lambda: x * float(x.sum().item()))
    if fused_cpu.AVAILABLE:  # a native call whose value the Python around it reads
        with pytest.raises(NotReplayable, match="returned a value"):
            CpuStepGraph(Arena()).capture(lambda: x + len(fused_cpu._cpu_fused.dtypes()))


def _echo(ids: torch.Tensor, pos: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """A 'model' whose rows echo the step's inputs, written into a new tensor through views (with a
    scratch tensor that grows with the square of the batch, so a larger batch outgrows the arena)."""
    assert ctx.decode_block_tables is not None and ctx.decode_context_lens is not None and not ctx.prefills
    n = ids.shape[0]
    out = torch.empty(n, 5, dtype=torch.float64)
    scratch = torch.zeros(n * n * 64, dtype=torch.float64)
    for col, values in enumerate((ids, pos, ctx.slot_mapping, ctx.decode_context_lens, ctx.decode_block_tables[:, 1])):
        out[:, col] = values + scratch[:n]
    return out


def _step(graphs: CpuDecodeGraphs, n: int, base: int) -> None:
    rows = torch.arange(n) + base
    tables = torch.stack([rows, rows + 7], dim=1).to(torch.int32)
    out = graphs.run(rows, rows + 1, rows * 4, tables, (rows % 5 + 1).to(torch.int32))
    expected = torch.stack([rows, rows + 1, rows * 4, rows % 5 + 1, rows + 7], dim=1).double()
    assert torch.equal(out, expected)


def test_a_size_is_recorded_once_it_recurs() -> None:
    graphs = CpuDecodeGraphs(_echo, max_batch_size=8, max_model_len=64, block_size=4)
    assert graphs.buffers.block_tables.shape == (8, 16)  # every pass allows the whole context
    for base in range(cpu_graphs_module.RECORD_AFTER):
        _step(graphs, 3, 100 * base)  # eager
    assert graphs.recordings == 0 and not graphs._graphs
    _step(graphs, 3, 500)  # recorded: this step's result is the recording's
    assert graphs.recordings == 1 and set(graphs._graphs) == {(3, False)}
    for base in (600, 700):
        _step(graphs, 3, base)  # replayed
    assert graphs.recordings == 1
    with pytest.raises(ValueError, match="no CPU graph"):
        _step(graphs, 9, 0)


def test_graphs_in_an_outgrown_arena_are_recorded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_graphs_module, "RECORD_AFTER", 0)
    graphs = CpuDecodeGraphs(_echo, max_batch_size=8, max_model_len=64, block_size=4)
    _step(graphs, 2, 100)
    _step(graphs, 2, 200)
    assert graphs.recordings == 1
    generation = graphs.arena.generation
    _step(graphs, 8, 300)  # the scratch grows with n^2: more than the arena's linear headroom
    assert graphs.arena.generation > generation and graphs.recordings == 2
    _step(graphs, 2, 400)  # laid out in the old arena: recorded again
    assert graphs.recordings == 3
    for base in (500, 600):
        _step(graphs, 2, base)
        _step(graphs, 8, base)
    assert graphs.recordings == 3


def test_a_size_over_the_arena_budget_runs_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_graphs_module, "RECORD_AFTER", 0)
    monkeypatch.setattr(cpu_graphs_module, "MAX_ARENA_BYTES", 1024)  # size 1's pass fits, size 6's does not
    graphs = CpuDecodeGraphs(_echo, max_batch_size=8, max_model_len=64, block_size=4)
    for base in (100, 200, 300):
        _step(graphs, 1, base)
        _step(graphs, 6, base)
    assert set(graphs._graphs) == {(1, False)} and graphs._eager == {(6, False)}
    assert graphs.arena.buffer.numel() <= 1024


@torch.inference_mode()
def test_tensors_share_memory_once_no_later_step_reads_them() -> None:
    """A chain of temporaries, each read only by the next op: the layout reuses their memory, as an
    allocator would, where the recording kept all of them apart."""
    x = torch.randn(256)

    def chain() -> torch.Tensor:
        y = x
        for _ in range(20):
            y = y * 1.5 + 1.0
        return y

    graph = CpuStepGraph(Arena())
    out = graph.capture(chain)
    assert torch.equal(out, chain())
    assert graph.nbytes <= 3 * 1024  # 40 temporaries of 1 KiB recorded; 3 live at once at most
    x.normal_()
    graph.replay()
    assert torch.equal(out, chain())


def _generate(path: Path, dtype: str, params: list[SamplingParams], prompts: list[list[int]], eager: bool):
    llm = LLM(str(path), dtype=dtype, block_size=8, max_num_seqs=32, max_num_batched_tokens=96, enforce_eager=eager)
    outs = llm.generate(prompts, params)
    return [o.outputs[0].token_ids for o in outs], llm.llm_engine.runner.decode_graphs


@pytest.mark.parametrize(
    ("variant", "dtype", "temperature"),
    [("llama-gqa3-tied", "float32", 0.0), ("qwen2-bias", "float32", 1.0), ("mistral", "bfloat16", 0.0)],
)
def test_engine_tokens_with_graphs_are_the_eager_engines(
    tiny_variant, monkeypatch: pytest.MonkeyPatch, variant: str, dtype: str, temperature: float
) -> None:
    """Sequences of different lengths finish at different steps, so the decode batch passes through many
    sizes, each recorded by its second step and replayed after; sampled requests are seeded."""
    monkeypatch.setattr(cpu_graphs_module, "RECORD_AFTER", 1)
    prompts, params = mixed_workload(17)
    params = [SamplingParams(temperature=temperature, max_tokens=p.max_tokens, ignore_eos=True, seed=i)
              for i, p in enumerate(params)]  # fmt: skip
    path = tiny_variant(variant)
    eager, none = _generate(path, dtype, params, prompts, eager=True)
    replayed, graphs = _generate(path, dtype, params, prompts, eager=False)
    assert none is None and isinstance(graphs, CpuDecodeGraphs)
    assert len(graphs._graphs) >= 3  # several sizes replayed from recordings
    assert replayed == eager
