"""The offline API (vLLM's shape): ``LLM(model, ...).generate(prompts, SamplingParams(...))``."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from folio.engine.config import EngineConfig
from folio.engine.llm_engine import LLMEngine
from folio.engine.lora.request import LoRARequest
from folio.engine.outputs import RequestOutput, merge_outputs
from folio.engine.package_files import local_path
from folio.engine.sampling_params import SamplingParams, offset_seed

Prompt = str | list[int]


class LLM:
    """Batch generation over a model folder, a .gguf file or a pkg:// URL (`folio.engine.package_files`).
    Keyword arguments are `EngineConfig` fields."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.llm_engine = LLMEngine(EngineConfig(model=local_path(str(model)), **kwargs))  # pkg:// resolved
        self._ids = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def shutdown(self) -> None:
        """Release what the engine holds beyond memory: tensor-parallel ranks and their process group (so that
        another parallel engine can start in this process), the grammar compiler's threads. `del llm`, the
        end of a ``with LLM(...) as llm:`` block and the interpreter's exit do it too."""
        self.llm_engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order, each with ``params.n`` completions.
        ``lora_request``: the adapter of every prompt, or one per prompt (None: the base model); an adapter
        the engine does not know yet is added on first use, as vLLM's offline LLM does. ``priority``: one per
        prompt, under the priority scheduling policy (vLLM's)."""
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params_list = (
            [sampling_params] * len(prompt_list)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params_list) != len(prompt_list):
            raise ValueError(f"got {len(prompt_list)} prompts but {len(params_list)} sampling params")
        loras = (
            [lora_request] * len(prompt_list)
            if lora_request is None or isinstance(lora_request, LoRARequest)
            else list(lora_request)
        )
        if len(loras) != len(prompt_list):
            raise ValueError(f"got {len(prompt_list)} prompts but {len(loras)} LoRA requests")
        priorities = list(priority) if priority is not None else [0] * len(prompt_list)
        if len(priorities) != len(prompt_list):
            raise ValueError(f"got {len(prompt_list)} prompts but {len(priorities)} priorities")
        engine = self.llm_engine
        for lora in dict.fromkeys(r for r in loras if r is not None):
            known = {r.lora_name: r for r in engine.list_loras()}
            if known.get(lora.lora_name) != lora:
                engine.add_lora(lora)
        # (request index, completion index) of each engine request
        where: dict[str, tuple[int, int]] = {}
        bases = [str(next(self._ids)) for _ in prompt_list]
        try:
            for i, (prompt, params, base, lora, prio) in enumerate(
                zip(prompt_list, params_list, bases, loras, priorities, strict=True)
            ):
                for j, sub_id, sub_params in _fan_out(base, params):
                    engine.add_request(sub_id, prompt, sub_params, lora_request=lora, priority=prio)
                    where[sub_id] = (i, j)
        except Exception:
            for rid in where:  # nothing half-scheduled: drop what this call already queued
                engine.abort_request(rid)
            raise
        results: list[RequestOutput | None] = [None] * len(prompt_list)
        completions: list[dict[int, Any]] = [{} for _ in prompt_list]
        steps: dict[str, list[RequestOutput]] = {rid: [] for rid in where}  # each request's step outputs
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.request_id not in where:
                    continue
                steps[out.request_id].append(out)
                if not out.finished:
                    continue
                whole = merge_outputs(steps.pop(out.request_id))
                i, j = where[out.request_id]
                completion = whole.outputs[0]
                completion.index = j
                completions[i][j] = completion
                if results[i] is None:
                    results[i] = dataclasses.replace(whole, request_id=bases[i])
        failed = [c for done in completions for c in done.values() if c.finish_reason == "error"]
        if failed:  # the engine logged the cause; the step's other requests failed with it
            raise RuntimeError(f"{len(failed)} completion(s) failed in the engine")
        final: list[RequestOutput] = []
        for i, res in enumerate(results):
            assert res is not None
            res.outputs = [completions[i][j] for j in sorted(completions[i])]
            res.finished = True
            final.append(res)
        return final

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to one conversation or a list of them, then generate.
        ``tools`` (OpenAI's shape) go to the template, as vLLM's ``LLM.chat`` passes them."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        tok = self.get_tokenizer()
        extra = {"tools": tools} if tools else {}
        prompts: list[Prompt] = [
            list(tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=True, return_dict=True,
                                         **extra)["input_ids"])
            for conv in conversations  # type: ignore[union-attr]
        ]
        return self.generate(prompts, sampling_params)


def _fan_out(base: str, params: SamplingParams) -> list[tuple[int, str, SamplingParams]]:
    if params.n == 1:
        return [(0, base, params)]
    return [
        (j, f"{base}-{j}", dataclasses.replace(params, n=1, seed=offset_seed(params.seed, j)))
        for j in range(params.n)
    ]


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) for t in prompts):
        return [prompts]  # one prompt given as token ids
    return [p if isinstance(p, str) else list(p) for p in prompts]
