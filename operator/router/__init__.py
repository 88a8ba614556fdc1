"""The traffic router in front of an InferenceService's revisions (`folio router`).

config   the RouterConfig every source delivers (the JSON contract `folio up` writes)
sources  where configs come from: a JSON file (re-read on change), an in-process object; kube: the cluster
metric_names  the metrics' names and labels, shared with the canary analysis; metrics: the registry
state    what a config becomes: weighted split, replica pools, API keys
split    smooth weighted round-robin between revisions
balancer replicas per revision: prefix/session affinity on a hash ring with bounded loads (ring, affinity),
         or the least loaded; loadscrape: each engine's requests and KV usage; health: active checks
         (both on polling's per-replica loop)
outliers Envoy-style passive ejection: consecutive failures eject for a growing time, half-open readmission
proxy    one request: pick, attempt, retry on stable, overflow, shadow, relay as it arrives
hold     requests held while nothing is ready (scale from zero): bounded, timed out, released at a pace
timeouts how long an attempt may be silent (the canary: requestTimeout), and what the client then sees
app      the aiohttp app (/v1/*, /health, /ready, /metrics); server: run it (CLI or embedded)

Embedding (tests, benchmarks; `folio up` runs `folio router --config FILE` as a process):

    app = RouterApp("chat", InProcessSource(RouterConfig.parse({...})))
    async with running_router(app) as url:  # any free port; `folio router` listens on k8s.names.ROUTER_PORT
        ...
"""
