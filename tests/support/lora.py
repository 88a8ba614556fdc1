"""LoRA adapters for tests: peft's (`folio.operator.testing.lora.make_adapter`) on the tiny random models and
SmolLM2, peft's reference answers, and adapters written without building the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from folio.operator.testing.lora import LLAMA_TARGETS, PHI3_TARGETS, make_adapter  # noqa: F401 (the tests' import)


def peft_model(model_dir: Path, adapter_dir: Path) -> Any:
    """The unmerged `PeftModel` of ``adapter_dir`` over the model at ``model_dir`` (float32, eval mode)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter_dir).eval()


def peft_greedy(model_dir: Path, adapter: Any, prompts: list[list[int]], n: int) -> list[list[int]]:
    """``n`` greedy tokens for each prompt from peft's unmerged model; ``adapter``: its folder, a request
    with a ``lora_path``, or None for the base model."""
    import torch
    from transformers import AutoModelForCausalLM

    if adapter is None:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    else:
        model = peft_model(model_dir, Path(getattr(adapter, "lora_path", adapter)))
    outs = []
    with torch.inference_mode():
        for p in prompts:
            ids = model.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
            outs.append(ids[0, len(p):].tolist())
    return outs


def edit_adapter_config(adapter_dir: Path, **changes: Any) -> Path:
    """Rewrite fields of ``adapter_dir``'s adapter_config.json (a value of None deletes the field)."""
    file = Path(adapter_dir) / "adapter_config.json"
    cfg = json.loads(file.read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    file.write_text(json.dumps(cfg, indent=2))
    return Path(adapter_dir)


def write_random_adapter(
    layout: Any,
    out_dir: Path,
    *,
    r: int = 16,
    alpha: float = 32,
    target_modules: tuple[str, ...] = LLAMA_TARGETS,
    seed: int = 0,
    std: float = 0.02,
) -> Path:
    """An adapter folder in peft's format without building the model (for large models such as SmolLM2,
    where only the shapes matter): ``layout`` is a `folio.engine.lora.LoRALayout`."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, target in sorted(layout.modules.items()):
        if module.rsplit(".", 1)[-1] not in target_modules:
            continue
        shape = layout.shapes[(target.layer, target.proj)]
        rows = target.rows[1] - target.rows[0]
        tensors[f"base_model.model.{module}.lora_A.weight"] = torch.randn(r, shape.in_features, generator=gen) * std
        tensors[f"base_model.model.{module}.lora_B.weight"] = torch.randn(rows, r, generator=gen) * std
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, out_dir / "adapter_model.safetensors", metadata={"format": "pt"})
    config = {"peft_type": "LORA", "r": r, "lora_alpha": alpha, "target_modules": list(target_modules),
              "bias": "none", "use_rslora": False, "task_type": "CAUSAL_LM"}
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out_dir
