"""Structured output: answers constrained to a JSON schema, a regex, a choice or a grammar (xgrammar).

`params` is what a request asks for (vLLM's `StructuredOutputsParams` shape); `compiler` turns it into a
compiled grammar for this model's vocabulary, off the step loop and cached; `mask` is the sampler's side:
each constrained row's token bitmask and `logit_bias`, applied to the logits before a token is chosen.
"""
