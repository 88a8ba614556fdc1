"""Fleet rollouts: a RolloutPolicy sequences the canaries of many InferenceServices (issue 47).

    model    the RolloutPolicy resource (pydantic: the CRD is generated from it, like the InferenceService's)
    policy   the pure state machine: ``decide(spec, status, services, now)`` -> which canaries may start,
             the policy's next status and conditions; nothing in memory, so restarts and failovers keep it
    gate     what an InferenceService's pass reads of the policies of its namespace: may its new revision
             start its canary now, or does it wait (Progressing=True, reason WaitingForRolloutPolicy)

The operator's handlers (`folio.operator.controller.fleet`) read the policies and the services' statuses,
run `policy.decide` and write the policy's status; an InferenceService's pass reads that status through a
kopf index (`gate.hold`). docs/rollouts.md ("Fleet rollouts") has the long version.
"""
