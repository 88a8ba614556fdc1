"""Speculative decoding (issue 45): proposals of several tokens a step, verified exactly by the target model.

`config` reads ``--speculative-config`` (vLLM's JSON), `ngram` proposes tokens by prompt lookup, and
`rejection` decides which proposed tokens the target keeps so that its output distribution is unchanged.
"""
