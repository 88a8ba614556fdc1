"""The kopf operator (`folio operator`): thin handlers around the pure rollout state machine and plan.

    cli        `folio operator`: settings, credentials, kopf.run
    handlers   kopf registration: create/resume/update, the per-object clock daemon, deletion, indexes
    reconcile  one pass: read -> observe -> sample -> rollout.advance -> serving.plan -> execute -> status
    children   an InferenceService's children and pods from kopf's indexes, and what this pass expects of them
    observe    the rollout's facts from those children (weights, ready replicas, crash loops)
    executor   server-side apply what the plan has and the cluster lacks, delete what it no longer has
    discovery  which optional kinds (CRDs that may be absent) the cluster serves
    watches    kopf's watched resources, extended when an optional kind's CRD arrives after the start
    metrics    the operator's own Prometheus metrics
"""
