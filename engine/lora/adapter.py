"""Loading a peft LoRA adapter folder (`adapter_config.json`, `adapter_model.safetensors`) into the packed
pairs the batched LoRA op multiplies by, refusing whatever it cannot serve exactly with a message that
names the file and the field or module.

Packing (see `folio.engine.lora.layout`): a module's ``lora_A`` [r, in] goes to rows
``block*max_rank : block*max_rank + r`` of its projection's ``a``, and ``scaling * lora_B`` [rows, r] to
its output rows and the same rank columns of ``b``; everything else stays zero. A whole fused module
(``qkv_proj``) of a parameter with slices is split over the slices' blocks: its ``lora_A`` in each, each
slice's rows of ``lora_B`` in that slice's block. So for every module, ``(x @ a.T @ b.T)[:, rows]`` is
peft's ``scaling * lora_B(lora_A(x))``, and block ``j`` of ``b`` is zero outside `LoRALayout.blocks`' rows.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from folio.engine.config import ModelConfig
from folio.engine.digest import DigestMismatchError, compute_digest, verify_digest
from folio.engine.lora.layout import LoRALayout

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_KEY = re.compile(r"^(?P<module>.+)\.(?P<kind>lora_A|lora_B)\.weight$")
_EMBEDDING_MODULES = ("embed_tokens", "lm_head")
_VARIANTS = ("alora_invocation_tokens", "arrow_config", "use_bdlora", "use_qalora", "kasa_config",
             "monteclora_config", "velora_config")


class LoRAError(ValueError):
    """An adapter the engine refuses (a client's 400, or a start-up error for --lora-modules)."""


@dataclass(frozen=True)
class LoRAWeights:
    """One projection's packed pair: ``delta = x @ a.T @ b.T`` (the scaling is folded into ``b``)."""

    a: torch.Tensor  # [n_slices * max_rank, in]
    b: torch.Tensor  # [out, n_slices * max_rank]


@dataclass
class LoRAAdapter:
    name: str
    path: Path
    rank: int
    max_rank: int
    scaling: float
    digest: str | None
    # per decoder layer: projection ("qkv", "o", "gate_up", "down") → its pair; absent: not targeted
    layers: list[dict[str, LoRAWeights]] = field(default_factory=list)
    modules: tuple[str, ...] = ()  # the checkpoint modules it adapts

    def get(self, layer: int, proj: str) -> LoRAWeights | None:
        return self.layers[layer].get(proj)

    @property
    def size_bytes(self) -> int:
        """Bytes its packed tensors take (what it costs in the host cache)."""
        return sum(w.a.nbytes + w.b.nbytes for per_layer in self.layers for w in per_layer.values())


def load_adapter(
    path: str | Path,
    model_config: ModelConfig | LoRALayout,
    *,
    max_rank: int,
    digest: str | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    name: str | None = None,
) -> LoRAAdapter:
    """The adapter at ``path`` packed for ``model_config``'s model (a `LoRALayout` may stand for it)."""
    root = Path(path)
    name = name or root.name
    if not root.is_dir():
        raise LoRAError(f"adapter {name!r}: {root} is not a folder (an adapter is what peft's save_pretrained writes)")
    config_file, weights_file = root / CONFIG_FILE, root / WEIGHTS_FILE
    if not config_file.is_file():
        raise LoRAError(f"adapter {name!r}: {config_file} is missing")
    if not weights_file.is_file():
        pickled = [p.name for p in (root / "adapter_model.bin", root / "adapter_model.pt") if p.is_file()]
        if pickled:
            raise LoRAError(f"adapter {name!r}: {root / pickled[0]} is a pickle checkpoint; only {WEIGHTS_FILE} is "
                            "supported (save it with safe_serialization=True)")
        raise LoRAError(f"adapter {name!r}: {weights_file} is missing")
    try:
        found = verify_digest(root, digest) if digest is not None else compute_digest(root)
    except DigestMismatchError as exc:
        raise LoRAError(f"adapter {name!r}: {exc}") from None
    except (OSError, ValueError) as exc:
        raise LoRAError(f"adapter {name!r}: {exc}") from None
    layout = model_config if isinstance(model_config, LoRALayout) else LoRALayout(model_config)
    cfg = _read_config(config_file, name)
    r, scaling = _check_config(cfg, config_file, name, max_rank, layout)
    pairs = _read_pairs(weights_file, name)
    adapter = LoRAAdapter(name, root, r, max_rank, scaling, found, [{} for _ in range(layout.num_layers)])
    _pack(adapter, pairs, layout, weights_file, dtype, device)
    return adapter


# --- adapter_config.json ------------------------------------------------------------------------------


def _read_config(file: Path, name: str) -> dict[str, Any]:
    try:
        cfg = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoRAError(f"adapter {name!r}: {file} is not valid JSON: {exc}") from None
    if not isinstance(cfg, dict):
        raise LoRAError(f"adapter {name!r}: {file} must hold a JSON object")
    return cfg


def _check_config(
    cfg: dict[str, Any], file: Path, name: str, max_rank: int, layout: LoRALayout
) -> tuple[int, float]:
    """(r, scaling), or a refusal naming the field."""

    def refuse(field: str, why: str) -> LoRAError:
        return LoRAError(f"adapter {name!r}: {file}: {field}: {why}")

    peft_type = cfg.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        raise refuse("peft_type", f"{peft_type!r} is not supported (only LORA adapters are)")
    # features that change the math beyond x @ A.T @ B.T * scaling, or touch more than the projections
    if cfg.get("use_dora"):
        raise refuse("use_dora", "DoRA adapters are not supported")
    if cfg.get("modules_to_save"):
        raise refuse("modules_to_save", f"{cfg['modules_to_save']!r}: adapters that replace whole modules are not supported")
    if cfg.get("bias", "none") != "none":
        raise refuse("bias", f"{cfg['bias']!r} is not supported (only 'none')")
    if cfg.get("lora_bias"):
        raise refuse("lora_bias", "LoRA B biases are not supported")
    if cfg.get("fan_in_fan_out"):
        raise refuse("fan_in_fan_out", "transposed (Conv1D-style) weights are not supported")
    for key in ("rank_pattern", "alpha_pattern"):
        if cfg.get(key):
            raise refuse(key, f"{cfg[key]!r}: per-module ranks or alphas are not supported")
    if cfg.get("target_parameters"):
        raise refuse("target_parameters", f"{cfg['target_parameters']!r}: LoRA on parameters (MoE experts) is not supported")
    if cfg.get("trainable_token_indices"):
        raise refuse("trainable_token_indices", "embedding adapters are not supported")
    if cfg.get("layer_replication"):
        raise refuse("layer_replication", "is not supported")
    for key in _VARIANTS:  # LoRA variants whose forward differs from x @ A.T @ B.T * scaling
        if cfg.get(key):
            raise refuse(key, f"{cfg[key]!r}: this LoRA variant is not supported")
    r = cfg.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise refuse("r", f"must be an integer >= 1, got {r!r}")
    if r > max_rank:
        raise refuse("r", f"rank {r} is above --max-lora-rank {max_rank}")
    alpha = cfg.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise refuse("lora_alpha", f"must be a number, got {alpha!r}")
    _check_targets(cfg.get("target_modules"), refuse, layout)
    return r, alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r


def _check_targets(targets: Any, refuse: Any, layout: LoRALayout) -> None:
    """target_modules as peft matches it: a list of name suffixes, or a regex the full module name matches.
    The weights file says which modules are adapted; this refuses names the model does not have."""
    if targets is None or targets == "all-linear":
        return
    names = [*layout.modules, *layout.other_modules, "model.embed_tokens", "lm_head"]
    if isinstance(targets, str):
        try:
            matched = [n for n in names if re.fullmatch(targets, n)]
        except re.error as exc:
            raise refuse("target_modules", f"{targets!r} is not a valid regular expression: {exc}") from None
        _check_kinds(matched, refuse, layout)
        if not matched:
            raise refuse("target_modules", f"{targets!r} matches no module of the model")
        return
    if not isinstance(targets, list) or not all(isinstance(t, str) for t in targets):
        raise refuse("target_modules", f"must be a list of module names or a regex string, got {targets!r}")
    for target in targets:
        matched = [n for n in names if n == target or n.endswith("." + target)]
        _check_kinds(matched, refuse, layout)
        if not matched:
            raise refuse("target_modules", f"{target!r} is not a module of {layout.architecture} "
                         f"(LoRA-able: {', '.join(sorted(layout.module_names()))})")


def _check_kinds(matched: list[str], refuse: Any, layout: LoRALayout) -> None:
    for module in matched:
        why = _unsupported(module, layout)
        if why is not None:
            raise refuse("target_modules", why)


def _unsupported(module: str, layout: LoRALayout) -> str | None:
    """Why LoRA on ``module`` is refused, or None where it is supported."""
    if module in layout.modules:
        return None
    short = module.rsplit(".", 1)[-1]
    if short in _EMBEDDING_MODULES:
        return f"{module}: embedding and LM-head adapters are not supported"
    if ".experts" in module or short.startswith("experts"):
        return f"{module}: LoRA on MoE experts is not supported (attention projections of MoE models are)"
    pname = layout.other_modules.get(module, "")
    if pname.endswith("router_weight"):
        return f"{module}: LoRA on the MoE router is not supported"
    if pname:
        return f"{module}: not a linear projection LoRA can adapt"
    return f"{module} is not a module of {layout.architecture}"


# --- adapter_model.safetensors ------------------------------------------------------------------------


def _read_pairs(file: Path, name: str) -> dict[str, dict[str, torch.Tensor]]:
    """checkpoint module name → {"lora_A": …, "lora_B": …}."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(file)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise LoRAError(f"adapter {name!r}: {file} is not a readable safetensors file: {exc}") from None
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.match(key.removeprefix(_PREFIX))
        if m is None:
            what = "embedding adapters are" if "lora_embedding" in key else (
                "DoRA magnitudes are" if "magnitude" in key else "this tensor is")
            raise LoRAError(f"adapter {name!r}: {file}: tensor {key}: {what} not supported")
        pairs.setdefault(m["module"], {})[m["kind"]] = tensor
    if not pairs:
        raise LoRAError(f"adapter {name!r}: {file} holds no LoRA tensors")
    return pairs


def _pack(
    adapter: LoRAAdapter,
    pairs: dict[str, dict[str, torch.Tensor]],
    layout: LoRALayout,
    file: Path,
    dtype: torch.dtype,
    device: torch.device | str,
) -> None:
    r, max_rank, name = adapter.rank, adapter.max_rank, adapter.name
    packed: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for module in sorted(pairs):
        why = _unsupported(module, layout)
        if why is not None:
            raise LoRAError(f"adapter {name!r}: {file}: {why}")
        pair = pairs[module]
        if set(pair) != {"lora_A", "lora_B"}:
            missing = ({"lora_A", "lora_B"} - set(pair)).pop()
            raise LoRAError(f"adapter {name!r}: {file}: {module} has no {missing}.weight")
        target = layout.modules[module]
        shape = layout.shapes[(target.layer, target.proj)]
        rows = target.rows[1] - target.rows[0]
        a, b = pair["lora_A"], pair["lora_B"]
        for kind, got, expected in (("lora_A", a, (r, shape.in_features)), ("lora_B", b, (rows, r))):
            if tuple(got.shape) != expected:
                raise LoRAError(f"adapter {name!r}: {file}: {module}.{kind}.weight has shape {tuple(got.shape)}, "
                                f"expected {expected} (r={r}; the base model's {module} is [{rows}, "
                                f"{shape.in_features}]): the adapter does not fit this model")
        key = (target.layer, target.proj)
        if key not in packed:  # float32 while filling: the scaling is folded in before rounding to dtype
            packed[key] = (torch.zeros(shape.a_shape(max_rank)), torch.zeros(shape.b_shape(max_rank)))
        a_packed, b_packed = packed[key]
        # a whole fused module of a parameter with slices goes to every slice's block, with its rows there
        whole = target.rows == (0, shape.out_features)
        places = list(enumerate(layout.blocks[key])) if whole else [(target.block, target.rows)]
        for block, (start, stop) in places:
            lo = block * max_rank
            if a_packed[lo:lo + r].any() or b_packed[start:stop, lo:lo + r].any():
                raise LoRAError(f"adapter {name!r}: {file}: {module} overlaps another module of the same projection")
            a_packed[lo:lo + r] = a.float()
            b_packed[start:stop, lo:lo + r] = b[start - target.rows[0]:stop - target.rows[0]].float() * adapter.scaling
    for (layer, proj), (a_packed, b_packed) in packed.items():
        adapter.layers[layer][proj] = _weights(a_packed, b_packed, dtype, device)
    adapter.modules = tuple(sorted(pairs))


def _weights(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, device: torch.device | str) -> LoRAWeights:
    return LoRAWeights(a.to(device=device, dtype=dtype).contiguous(), b.to(device=device, dtype=dtype).contiguous())
