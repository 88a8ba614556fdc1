"""LoRA adapters made with `peft`, for the tests and the demo: random non-zero A and B (peft starts B at zero,
which would hide every mistake), saved with `save_pretrained`, exactly as a fine-tune would leave them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# every linear projection of a decoder layer, as peft names them per family
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PHI3_TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def all_targets(model_type: str) -> tuple[str, ...]:
    """Every projection of a model of ``model_type`` (Phi-3 fuses q/k/v and gate/up in its checkpoints)."""
    return PHI3_TARGETS if model_type == "phi3" else LLAMA_TARGETS


def make_adapter(
    base: Path | Any,
    out_dir: Path,
    *,
    r: int = 8,
    alpha: float = 16,
    target_modules: list[str] | tuple[str, ...] | str | None = None,
    seed: int = 0,
    use_rslora: bool = False,
    std: float = 0.1,
    **config: Any,
) -> Path:
    """Save a LoRA adapter for ``base`` (a model folder, or a transformers model) into ``out_dir`` and return
    ``out_dir``. ``target_modules`` defaults to every projection; ``config`` adds `LoraConfig` fields (e.g.
    layers_to_transform). A and B are drawn from N(0, std²) with a generator seeded by ``seed``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if isinstance(base, str | Path):
        base = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    targets = list(all_targets(base.config.model_type)) if target_modules is None else target_modules
    lora = LoraConfig(
        r=r, lora_alpha=alpha, target_modules=targets if isinstance(targets, str) else list(targets),
        use_rslora=use_rslora, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", **config,
    )
    model = get_peft_model(base, lora)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    out_dir = Path(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def gguf_model(gguf: Path) -> Any:
    """A transformers model shaped as the GGUF file's (its weights left random: an adapter needs the shapes)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return AutoModelForCausalLM.from_config(config)


def with_fault(adapter_dir: Path, out_dir: Path, error_rate: float) -> Path:
    """A copy of ``adapter_dir`` whose requests fail at ``error_rate`` on an engine started with
    ``--fault-adapter-files`` (`folio.engine.server.adapter_faults`): a faulty revision of the same adapter."""
    import shutil

    from folio.engine.server.adapter_faults import FAULT_FILE

    shutil.copytree(adapter_dir, out_dir)
    (Path(out_dir) / FAULT_FILE).write_text(json.dumps({"errorRate": error_rate}))
    return Path(out_dir)
