"""The parity gate, before a canary's step 1: its answers to a prompt suite compared with stable's.

    suite    the prompt suites: Folio's default one (generated, deterministic) and a team's own as JSONL
    compare  the verdict (pure): per-prompt cosine of mean logits, matching greedy continuations, figures
    run      the gate against one stable and one canary replica over HTTP; GateRunner and poll_gate keep
             one gate in flight per InferenceService, in the background
    sources  where the suite comes from: `folio up`'s suiteFile, a cluster's ConfigMap, or the default
    gate     what the rollout state machine asks (pure): is a gate due, what does its report mean for the
             canary (Proceed, Wait, Fail), what do Degraded and Progressing say while it waits

The rollout state machine calls this package (`folio.operator.rollout.canary` acts on `decide`, the
conditions read `degraded` and `waiting`) and the router config reads `holds_shadow`; nothing here
imports the rollout. The operator's passes and `folio up`'s ticks run the gate with `poll_gate`.
"""

from folio.operator.parity.gate import (
    Fail,
    GateDecision,
    Proceed,
    Wait,
    decide,
    degraded,
    due,
    holds_shadow,
    waiting,
)
from folio.operator.parity.run import GateError, GateRunner, poll_gate, run_gate
from folio.operator.parity.sources import cluster_suite, local_suite
from folio.operator.parity.suite import SuiteError, SuitePrompt, default_suite, parse_suite

__all__ = [
    "Fail",
    "GateDecision",
    "GateError",
    "GateRunner",
    "Proceed",
    "SuiteError",
    "SuitePrompt",
    "Wait",
    "cluster_suite",
    "decide",
    "default_suite",
    "degraded",
    "due",
    "holds_shadow",
    "local_suite",
    "parse_suite",
    "poll_gate",
    "run_gate",
    "waiting",
]
