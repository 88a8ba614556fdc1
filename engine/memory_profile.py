"""KV-cache sizing from a profiling forward pass, as vLLM does it.

The engine loads the weights, runs the largest steps it will ever schedule (the scheduler's token budget
as one prompt, and spread over ``max_num_seqs`` sampled sequences) against a one-block cache, and measures how far memory
rose above what the weights and the runtime already hold. The KV cache gets what remains of
``utilization × total``:

    kv = total × utilization − in use after loading − the step's activation peak

On CUDA the meter is the caching allocator's peak (``torch.cuda.max_memory_allocated``) and the device's
free memory; on the CPU it is the process's resident set and its high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs``), which lets the same accounting be tested without a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import psutil
import torch

from folio.engine.sampling_params import SamplingParams
from folio.engine.scheduler import ScheduledSeq
from folio.engine.sequence import Sequence

if TYPE_CHECKING:
    from folio.engine.model_runner import ModelRunner

PROFILE_KV_BLOCKS = 1  # every dummy sequence's table points at this one block: the step's shape is what counts


class DeviceMemory(Protocol):
    def total(self) -> int:
        """The memory the utilization is a share of."""

    def in_use(self) -> int:
        """What is held now, by this process and (on a GPU) by everyone else."""

    def reset_peak(self) -> None: ...

    def peak(self) -> int:
        """The highest ``in_use`` since ``reset_peak``."""


class CudaMemory:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def total(self) -> int:
        return torch.cuda.mem_get_info(self.device)[1]

    def in_use(self) -> int:
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free

    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self._base_in_use = self.in_use()
        self._base_allocated = torch.cuda.memory_allocated(self.device)

    def peak(self) -> int:
        # Device-wide use at reset plus how far this process's tensors rose above their level then.
        torch.cuda.synchronize(self.device)
        return self._base_in_use + torch.cuda.max_memory_allocated(self.device) - self._base_allocated


_STATUS = Path("/proc/self/status")


class CpuMemory:
    """This process's resident memory; ``total`` defaults to the machine's RAM (a test passes a smaller
    pretend device to exercise the GPU's accounting on the CPU)."""

    def __init__(self, total: int | None = None) -> None:
        self._total = total if total is not None else psutil.virtual_memory().total

    def total(self) -> int:
        return self._total

    def in_use(self) -> int:
        return _status_bytes("VmRSS")

    def reset_peak(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident set size to the current

    def peak(self) -> int:
        return _status_bytes("VmHWM")


def meter_for(device: torch.device) -> DeviceMemory | None:
    """How the engine measures ``device`` for sizing; None: no profiling (the CPU's fixed share of RAM)."""
    return CudaMemory(device) if device.type == "cuda" else None


def _status_bytes(field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.MULTILINE)
    assert match is not None, f"{field} is missing from {_STATUS}"
    return int(match.group(1)) * 1024


@dataclass(frozen=True)
class StepProfile:
    num_tokens: int
    num_seqs: int
    in_use: int  # before the step: weights, runtime, the one-block cache
    peak: int  # during it

    @property
    def activation_bytes(self) -> int:
        return max(0, self.peak - self.in_use)


def profile_batch(
    num_tokens: int, num_seqs: int, vocab_size: int, block_size: int, *, prompt_logprobs: bool = False
) -> list[ScheduledSeq]:
    """The largest step: ``num_tokens`` prompt tokens over ``num_seqs`` fresh sequences, each sampled
    with top-k and top-p on (the sampler's most expensive path); with ``prompt_logprobs``, each also
    asking for its prompt's log-probabilities and mean logits (slices of [rows, vocabulary] logits)."""
    assert 0 < num_seqs <= num_tokens
    params = SamplingParams(max_tokens=1, temperature=1.0, top_k=50, top_p=0.9, repetition_penalty=1.1,
                            prompt_logprobs=5 if prompt_logprobs else None, mean_prompt_logits=prompt_logprobs)
    batch = []
    for i in range(num_seqs):
        n = num_tokens // num_seqs + (i < num_tokens % num_seqs)
        seq = Sequence(f"profile-{i}", None, [(7 * i + t) % vocab_size for t in range(n)], params, n + 1,
                       frozenset())
        seq.block_table = [0] * -(-n // block_size)  # any block id serves: the step's K/V are thrown away
        batch.append(ScheduledSeq(seq, n))
    return batch


def profile_step(
    runner: ModelRunner, meter: DeviceMemory, num_tokens: int, num_seqs: int,
    run_step: Callable[[list[ScheduledSeq]], object] | None = None,
) -> StepProfile:
    """Runs the largest steps once on ``runner`` (whose cache may be a single block) and measures the
    worse: ``num_tokens`` as one prompt (attention's largest shape) and spread over ``num_seqs``
    sequences (the sampler's largest batch). ``run_step`` (default ``runner.step``) is how the engine
    runs a step, e.g. with the other tensor-parallel ranks beside it."""
    longest = min(num_tokens, runner.cfg.max_model_len - 1)
    # the longest prompt, alone and again asking for its prompt log-probabilities (their logits come in
    # slices beside the step's activations), then the most sequences
    shapes = [(longest, 1, False), (longest, 1, True), (num_tokens, min(num_seqs, num_tokens), False)]
    rng = runner.sampler.generator.get_state()  # the dummy draws must not shift what requests sample
    meter.reset_peak()
    before = meter.in_use()
    for tokens, seqs, logprobs in shapes:
        (run_step or runner.step)(profile_batch(tokens, seqs, runner.cfg.vocab_size, runner.block_size,
                                                prompt_logprobs=logprobs))
    runner.sampler.generator.set_state(rng)
    return StepProfile(num_tokens, shapes[-1][1], before, meter.peak())


def held_by(meter: DeviceMemory, make: Callable[[], object]) -> int:
    """The device memory ``make`` leaves held once it returns (e.g. captured CUDA graphs: their memory pool
    and cuBLAS's workspaces), measured device-wide from an emptied allocator cache."""
    meter.reset_peak()  # synchronizes and empties the allocator's cache first
    before = meter.in_use()
    make()
    meter.reset_peak()
    return max(0, meter.in_use() - before)


def kv_cache_budget(meter: DeviceMemory, utilization: float, profile: StepProfile) -> int:
    """Bytes the KV cache may take: the rest of ``utilization × total`` once the weights and the largest
    step's activations have theirs (negative when they alone exceed it)."""
    return int(meter.total() * utilization) - profile.in_use - profile.activation_bytes
