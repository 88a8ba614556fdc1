"""What a parallel engine (`engine.args.tensorParallelSize: T`, `pipelineParallelSize: P`) asks of its pods.

T × P ranks, one GPU each. A pod's GPUs (``nvidia.com/gpu``) are `spec.engine.resources`' when set
explicitly, else T: one pipeline stage per pod. When the ranks fit one pod's GPUs the replica is one pod,
as without parallelism; when they do not, a replica is a group of ``T × P / GPUs`` pods (a LeaderWorkerSet,
`folio.operator.serving.lws`), each holding the same number of ranks, and a tensor-parallel group never
spans pods (its all-reduces run every layer: NVLink, not the network). Numbers that do not divide so are a
planning error naming them. Without a GPU count (CPU ranks) every rank runs in one pod.

Each pod gets a memory-backed ``/dev/shm`` sized for NCCL's intra-node buffers (1 GiB per rank it holds; it
counts against the pod's memory). The KV cache needs nothing here: the engine sizes it per device
(``kvCacheMemoryGib`` and ``gpuMemoryUtilization`` apply to each GPU).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from folio.operator.serving.errors import PlanningError
from folio.operator.spec import EngineArgValue, EngineSpec, ResourceRequirements

GPU = "nvidia.com/gpu"
SHM_PER_RANK_GIB = 1


def _size(args: Mapping[str, EngineArgValue], key: str) -> int:
    size = args.get(key, 1)
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 1 else 1


def tensor_parallel_size(args: Mapping[str, EngineArgValue]) -> int:
    """The engine args' tensorParallelSize (1 when unset; its type and range are `engine_flags`' to check)."""
    return _size(args, "tensorParallelSize")


def pipeline_parallel_size(args: Mapping[str, EngineArgValue]) -> int:
    """The engine args' pipelineParallelSize (1 when unset; checked like tensorParallelSize)."""
    return _size(args, "pipelineParallelSize")


def ranks(args: Mapping[str, EngineArgValue]) -> int:
    return tensor_parallel_size(args) * pipeline_parallel_size(args)


def engine_resources(engine: EngineSpec, args: Mapping[str, EngineArgValue]) -> ResourceRequirements:
    size = tensor_parallel_size(args)
    if "resources" in engine.model_fields_set or size == 1:
        return engine.resources
    return ResourceRequirements(limits={**engine.resources.limits, GPU: size}, requests=engine.resources.requests)


def gpus_per_pod(engine: EngineSpec, args: Mapping[str, EngineArgValue]) -> int | None:
    """The GPUs one engine pod holds (None: its resources ask for none)."""
    gpus = engine_resources(engine, args).limits.get(GPU)
    return None if gpus is None else _count(gpus)


def group_size(engine: EngineSpec, args: Mapping[str, EngineArgValue]) -> int:
    """Pods per replica: 1 when the ranks fit one pod. Numbers `check` refuses give 1 (never raises: a refused
    spec's older revisions are still planned)."""
    gpus, total, tp = gpus_per_pod(engine, args), ranks(args), tensor_parallel_size(args)
    if gpus is None or gpus < 1 or total <= gpus or gpus % tp or total % gpus:
        return 1
    return total // gpus


def ranks_per_pod(engine: EngineSpec, args: Mapping[str, EngineArgValue]) -> int:
    return ranks(args) // group_size(engine, args)


def check(engine: EngineSpec) -> None:
    """Raise `PlanningError` when a parallel engine's ranks cannot be laid out on its pods' GPUs."""
    args = engine.args
    tp, pp = tensor_parallel_size(args), pipeline_parallel_size(args)
    total = tp * pp
    gpus = engine_resources(engine, args).limits.get(GPU)
    if total == 1 or gpus is None:
        return
    count = _count(gpus)
    if total <= count:  # one pod holds every rank
        return
    given = f"spec.engine.resources.limits gives {GPU}: {gpus}"
    if count < tp or count % tp:
        what = f"{tp} GPUs" if count < tp else f"a multiple of {tp} GPUs per pod"
        raise PlanningError(
            "InvalidEngineArgs",
            f"spec.engine.args.tensorParallelSize {tp} needs {what} (a tensor-parallel group never spans pods), "
            f"but {given}",
        )
    if total % count:
        raise PlanningError(
            "InvalidEngineArgs",
            f"spec.engine.args.pipelineParallelSize: tensorParallelSize {tp} × pipelineParallelSize {pp} = "
            f"{total} ranks is not a multiple of the {count} GPUs per pod ({given}): every pod of a group must "
            f"hold as many ranks as the others",
        )


def shm_volume(engine: EngineSpec, args: Mapping[str, EngineArgValue]) -> dict[str, Any]:
    """The pod's /dev/shm volume: memory-backed, with room for NCCL when the pod holds several ranks."""
    size = ranks_per_pod(engine, args)
    empty_dir: dict[str, Any] = {"medium": "Memory"}
    if size > 1:
        empty_dir["sizeLimit"] = f"{SHM_PER_RANK_GIB * size}Gi"
    return {"name": "dshm", "emptyDir": empty_dir}


def _count(value: int | str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0
