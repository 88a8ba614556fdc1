"""What a tensor-parallel engine (`engine.args.tensorParallelSize: N`) asks of its pod.

N GPUs (``nvidia.com/gpu: N``) unless `spec.engine.resources` was set explicitly (an explicit GPU count
below N is a planning error: the engine would refuse to start), and a memory-backed ``/dev/shm`` sized for
NCCL's intra-node buffers (1 GiB per rank; it counts against the pod's memory). The KV cache needs nothing
here: the engine sizes it per device (``kvCacheMemoryGib`` and ``gpuMemoryUtilization`` apply to each GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from folio.operator.serving.errors import PlanningError
from folio.operator.spec import EngineArgValue, EngineSpec, ResourceRequirements

GPU = "nvidia.com/gpu"
SHM_PER_RANK_GIB = 1


def tensor_parallel_size(args: Mapping[str, EngineArgValue]) -> int:
    """The engine args' tensorParallelSize (1 when unset; its type and range are `engine_flags`' to check)."""
    size = args.get("tensorParallelSize", 1)
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 1 else 1


def engine_resources(engine: EngineSpec, args: Mapping[str, EngineArgValue]) -> ResourceRequirements:
    size = tensor_parallel_size(args)
    if "resources" in engine.model_fields_set or size == 1:
        return engine.resources
    return ResourceRequirements(limits={**engine.resources.limits, GPU: size}, requests=engine.resources.requests)


def check(engine: EngineSpec) -> None:
    """Raise `PlanningError` when explicit resources give a tensor-parallel engine fewer GPUs than ranks."""
    size = tensor_parallel_size(engine.args)
    gpus = engine_resources(engine, engine.args).limits.get(GPU)
    if size > 1 and gpus is not None and _count(gpus) < size:
        raise PlanningError(
            "InvalidEngineArgs",
            f"spec.engine.args.tensorParallelSize {size} needs {size} GPUs, but spec.engine.resources.limits "
            f"gives {GPU}: {gpus}",
        )


def shm_volume(args: Mapping[str, EngineArgValue]) -> dict[str, Any]:
    """The pod's /dev/shm volume: memory-backed, with room for NCCL when the engine spans several GPUs."""
    size = tensor_parallel_size(args)
    empty_dir: dict[str, Any] = {"medium": "Memory"}
    if size > 1:
        empty_dir["sizeLimit"] = f"{SHM_PER_RANK_GIB * size}Gi"
    return {"name": "dshm", "emptyDir": empty_dir}


def _count(value: int | str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0
