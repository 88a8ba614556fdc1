"""The names and labels of the router's metrics: what `RouterMetrics` exports and the analysis reads.

`folio.operator.router.metrics` registers them, `folio.operator.analysis` and the autoscaler
(`folio.operator.autoscaling.load`) parse them (from router scrapes or PromQL) and the tests generate
and read them with these same constants, so a rename cannot leave the canary analysis reading nothing.
A contract between processes, like the spec: it sits below every package that reads or writes it.
"""

from __future__ import annotations

# Label names. Every series is per InferenceService and revision.
ISVC = "isvc"
REVISION = "revision"
CODE = "code"  # the upstream's HTTP status, "error" when it never answered, "timeout" when too late
TIMEOUT = "timeout"  # the code of an attempt that timed out (router/timeouts.py)
# Requests, their duration and time to first token also by adapter: the `model` a request named when it is
# one of spec.adapters, and the adapter revision the router sent it to ("" and "" for the base model).
ADAPTER = "adapter"
ADAPTER_REVISION = "adapter_revision"

# Upstream attempts by revision and outcome: requests and errors of the analysis.
REQUESTS = "folio_router_requests_total"
RETRIES = "folio_router_retries_total"
# Histograms: latency p99 and time-to-first-token p95 of the analysis.
DURATION = "folio_router_request_duration_seconds"
TTFT = "folio_router_time_to_first_token_seconds"
WEIGHT = "folio_router_traffic_weight"
SHADOW_REQUESTS = "folio_router_shadow_requests_total"
SHADOW_DURATION = "folio_router_shadow_request_duration_seconds"
# A reproducible mirrored request's canary answer against the primary's (operator/router/shadow_compare.py)
SHADOW_COMPARISONS = "folio_router_shadow_comparisons_total"
SHADOW_LATENCY_DIFFERENCE = "folio_router_shadow_latency_difference_seconds"  # canary minus primary
RESULT = "result"  # match | mismatch | error
IN_FLIGHT = "folio_router_in_flight"
REPLICA = "replica"  # a replica's base URL
EJECTIONS = "folio_router_ejections_total"
EJECTED = "folio_router_replica_ejected"
OVERFLOW_REQUESTS = "folio_router_overflow_requests_total"
# Requests placed by their affinity key: where its prefix should be cached — a replica it went to lately, or
# its owner on the ring — (hit), passed on from there for load (spill), or new to the router's pool, so
# placed by load alone (new).
PREFIX_AFFINITY = "folio_router_prefix_affinity_total"
RESULT = "result"
AFFINITY_HIT = "hit"
AFFINITY_SPILL = "spill"
AFFINITY_NEW = "new"


def is_error(code: str) -> bool:
    """A failed upstream attempt: a 5xx answer, or no answer at all (``error``)."""
    return code == "error" or (len(code) == 3 and code.startswith("5"))
# Requests held while their revision has no ready replica (scale from zero), and how each hold ended.
HELD = "folio_router_held_requests"
HELD_TOTAL = "folio_router_holds_total"
OUTCOME = "outcome"  # served | timeout | full | gone
# Answers continued on another replica after theirs failed mid-answer (operator/router/migration.py), by the
# revision that failed, why and how it ended; and the gap the client saw at the seam.
MIGRATIONS = "folio_router_migrations_total"
MIGRATION_GAP = "folio_router_migration_gap_seconds"
REASON = "reason"
MIGRATION_RESET = "reset"  # the connection broke, or the answer ended before its end
MIGRATION_TIMEOUT = "timeout"  # silent past the inter-chunk timeout
MIGRATION_ENGINE_ERROR = "engine_error"  # the engine said it could not finish (a `failed` record)
MIGRATION_CONTINUED = "continued"
MIGRATION_FAILED = "failed"  # attempts exhausted, or an answer that cannot be continued
MIGRATION_NO_REPLICA = "no_replica"
# Per tenant (spec.access; operator/router/tenants.py): requests by the router's answer, whether it or an
# upstream gave it (401 and 429 are the router's own and never reach an analysed counter), and tokens.
TENANT = "tenant"
KIND = "kind"  # prompt | completion
TENANT_REQUESTS = "folio_router_tenant_requests_total"
TENANT_TOKENS = "folio_router_tenant_tokens_total"
# How long a tenant's request waited in the router while the replicas were saturated (`admission`), and the
# requests shed instead (503 with Retry-After; never a revision's error), by why: full (the queue had no room
# for it), displaced (a higher priority took its place), timeout (it waited past the queue's bound).
TENANT_QUEUE = "folio_router_tenant_queue_seconds"
TENANT_SHED = "folio_router_tenant_shed_total"
