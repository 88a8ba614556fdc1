"""Speculative decoding (issue 45): proposals of several tokens a step, verified exactly by the target model.

`config` reads ``--speculative-config`` (vLLM's JSON), `ngram` proposes tokens by prompt lookup, `speculator`
decides who proposes how many tokens in a step (and backs off), and `rejection` decides which proposed
tokens the target keeps so that its output distribution is unchanged. The scheduler schedules a draft with
its sequence's last token, the model runner verifies it (`ModelRunner._verify`), and `postprocess` appends
what was kept.
"""
