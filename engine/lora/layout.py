"""Where a peft adapter's modules land in Folio's fused projections, read from the model's own
checkpoint mapping (`checkpoint_names`), so LoRA and the weights loader agree on every family.

Each of a layer's four projection parameters (`qkv`, `o`, `gate_up`, `down`) gets a packed LoRA pair in
the batched op's layout: ``a`` [n_slices * max_rank, in] and ``b`` [out, n_slices * max_rank]. A checkpoint
module that fills rows ``rows`` of the parameter (q_proj, k_proj, v_proj; gate_proj, up_proj) owns rank
block ``block`` (its position in the parameter, top to bottom); a module filling the whole parameter
(Phi-3's qkv_proj and gate_up_proj, every o_proj and down_proj) owns block 0 over all rows, unless the
parameter has slices too (every family accepts both namings): then the adapter loader splits such a module
over the slices' blocks (its ``lora_A`` in each). Either way block ``j`` adds only to `blocks`' rows, and a
kernel skips the zeros elsewhere in its columns of ``b``.

On the CPU the stacks' ``b`` is rank-major in memory (`folio.kernels.lora_cpu`'s layout); the logical shape
is the same everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from folio.engine.config import ModelConfig
from folio.engine.layers.weights import deferred_params
from folio.kernels.lora_cpu import zeros_rank_major

# Folio's projection parameter → the name its LoRA pair goes by
PROJECTIONS = {"qkv_weight": "qkv", "o_weight": "o", "gate_up_weight": "gate_up", "down_weight": "down"}


@dataclass(frozen=True)
class ModuleTarget:
    """Where one checkpoint module (e.g. ``model.layers.3.self_attn.k_proj``) lands."""

    layer: int
    proj: str  # one of PROJECTIONS' values
    rows: tuple[int, int]  # output rows of the fused parameter it fills
    block: int  # its rank block in the packed pair


@dataclass(frozen=True)
class ProjectionShape:
    n_slices: int
    out_features: int
    in_features: int

    def a_shape(self, max_rank: int) -> tuple[int, int]:
        return (self.n_slices * max_rank, self.in_features)

    def b_shape(self, max_rank: int) -> tuple[int, int]:
        return (self.out_features, self.n_slices * max_rank)


class LoRALayout:
    """The LoRA-able modules of one model configuration."""

    def __init__(self, model_config: ModelConfig) -> None:
        from folio.engine.models.registry import model_class

        with torch.device("meta"), deferred_params():  # shapes only: nothing is allocated
            model = model_class(model_config.architecture)(model_config, model_config.max_position_embeddings)
        params = dict(model.named_parameters())
        targets = model.checkpoint_targets()
        self.architecture = model_config.architecture
        self.num_layers = model_config.num_hidden_layers
        self.modules: dict[str, ModuleTarget] = {}
        # checkpoint modules that are not a dense projection (experts, routers, norms) → their parameter
        self.other_modules: dict[str, str] = {}
        self.shapes: dict[tuple[int, str], ProjectionShape] = {}
        pieces: dict[str, list[tuple[str, tuple[int, int]]]] = {}  # parameter → its row-slice modules
        whole: dict[str, str] = {}
        for ckpt, (pname, index) in targets.items():
            if not ckpt.endswith(".weight"):
                continue
            module = ckpt.removesuffix(".weight")
            param = params.get(pname)
            kind = PROJECTIONS.get(pname.rsplit(".", 1)[-1])
            if kind is None or param is None or param.dim() != 2 or not pname.startswith("layers."):
                self.other_modules[module] = pname  # MoE experts' gate_up/down are 3-D: not dense projections
                continue
            out_features = param.shape[0]
            if index:
                start, stop, _ = index[0].indices(out_features)
                pieces.setdefault(pname, []).append((module, (start, stop)))
            else:
                whole[module] = pname
        for pname in {*pieces, *whole.values()}:
            layer, kind = int(pname.split(".")[1]), PROJECTIONS[pname.rsplit(".", 1)[-1]]
            param = params[pname]
            slices = sorted(pieces.get(pname, []), key=lambda m: m[1][0])
            self.shapes[(layer, kind)] = ProjectionShape(max(1, len(slices)), param.shape[0], param.shape[1])
            for block, (module, rows) in enumerate(slices):
                self.modules[module] = ModuleTarget(layer, kind, rows, block)
        for module, pname in whole.items():
            layer, kind = int(pname.split(".")[1]), PROJECTIONS[pname.rsplit(".", 1)[-1]]
            self.modules[module] = ModuleTarget(layer, kind, (0, params[pname].shape[0]), 0)
        # (layer, proj) → the output rows (start, stop) of each rank block: its slice's, or every row
        self.blocks: dict[tuple[int, str], tuple[tuple[int, int], ...]] = {
            (int(pname.split(".")[1]), PROJECTIONS[pname.rsplit(".", 1)[-1]]):
                tuple(rows for _, rows in sorted(pieces[pname], key=lambda m: m[1][0]))
                if pname in pieces else ((0, params[pname].shape[0]),)
            for pname in {*pieces, *whole.values()}
        }

    def module_names(self) -> set[str]:
        """Short names of the LoRA-able modules (q_proj, qkv_proj, …), for messages."""
        return {m.rsplit(".", 1)[-1] for m in self.modules}

    def allocate(
        self, slots: int, max_rank: int, dtype: torch.dtype, device: torch.device | str = "cpu"
    ) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
        """Zeroed device stacks for ``slots`` adapters: (layer, proj) → (a [S, R_p, in], b [S, out, R_p])."""
        return {
            key: zeroed_pair(slots, shape.n_slices * max_rank, shape.in_features, shape.out_features, dtype, device)
            for key, shape in sorted(self.shapes.items())
        }


def zeroed_pair(
    slots: int, rank: int, in_features: int, out_features: int, dtype: torch.dtype, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """One projection's zeroed stacks: ``a [slots, rank, in]``, ``b [slots, out, rank]`` (rank-major on the CPU)."""
    a = torch.zeros(slots, rank, in_features, dtype=dtype, device=device)
    if torch.device(device).type == "cpu":
        return a, zeros_rank_major(slots, out_features, rank, dtype)
    return a, torch.zeros(slots, out_features, rank, dtype=dtype, device=device)
