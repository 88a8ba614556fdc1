"""Canary analysis: one `AnalysisSample` per interval from the router's metrics, compared with stable.

    windows        per-revision counters from a router scrape, deltas between scrapes, quantiles, figures
    verdict        the figures held to the thresholds: Pass, Fail or Inconclusive, with the reasons
    growth         after an Inconclusive sample the window grows (since the step began) until minRequests
    router_scrape  the default source: every router's /metrics, as deltas since its previous scrape
    prometheus     the other source (``analysis.prometheus.url``): the same figures by PromQL
    sampler        when to sample (once per ``analysis.interval``) and from which source

Per revision: requests (one per upstream attempt), errors (5xx and ``code="error"``, which includes
the canary attempts the router then retried on stable: they count against the canary even though
the client got an answer), p99 latency from the duration histogram, p95 time to first token. The
metric names are the router's own (`folio.operator.metric_names`).
"""
