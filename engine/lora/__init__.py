"""Multi-LoRA serving: adapter requests (vLLM's `LoRARequest`), loading and checking peft adapter folders
into the batched op's packed layout, and the device slots with their host cache."""

from folio.engine.lora.adapter import LoRAAdapter, LoRAError, LoRAWeights, load_adapter
from folio.engine.lora.layout import PROJECTIONS, LoRALayout
from folio.engine.lora.request import LoRARequest
from folio.engine.lora.slots import LoRASlots

__all__ = [
    "PROJECTIONS",
    "LoRAAdapter",
    "LoRAError",
    "LoRALayout",
    "LoRARequest",
    "LoRASlots",
    "LoRAWeights",
    "load_adapter",
]
