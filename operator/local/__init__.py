"""`folio up` and the commands that work on a running one, for a local service or a cluster's alike.

    up / cli_up    `folio up FILE`: load the manifest and the state folder, run the runtime and its control endpoint
    runtime        the loop: observe processes -> rollout.advance -> serving.plan -> start/stop processes, router.json
    supervisor     engine and router processes: ports, health probes, restarts with backoff, crash loops, no orphans
    state          the state folder (.folio/): status, control endpoint, router config, weights cache, logs
    control        the control endpoint (loopback HTTP with a token); client: talking to it
    manifest       reading an InferenceService YAML; target: a local `folio up` or the cluster
    cli_apply, cli_status, cli_override   `folio apply`, `folio status`, `folio promote|abort|retry`
    render         the status table; demo: `make demo`
"""
