"""The `folio.kernels` path (what CUDA runs) gives the same tokens as the PyTorch CPU path.

The kernels dispatch CPU tensors to their PyTorch reference twins, so the engine's kernel wiring
(slot mapping, block tables, cu_seqlens, context lengths, in-place rotary, fused norms) is checked here
without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import torch

from folio.engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


def test_kernel_path_matches_cpu_path(tiny_variant) -> None:
    path: Path = tiny_variant("llama-gqa3-tied")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 512, (int(n),), generator=g).tolist() for n in (1, 5, 17, 40, 70, 33)]
    prompts.append(prompts[3] + [7, 8, 9])  # a prefix-cache hit: a prefill segment after cached blocks
    llm = LLM(str(path), max_num_batched_tokens=48)  # chunked prefill mixed with decodes
    expected = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    runner = llm.llm_engine.runner
    runner.use_kernels = True
    runner.model.use_kernels(True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
    assert got == expected
    assert llm.llm_engine.stats().prefix_cache_hits_total > 0
