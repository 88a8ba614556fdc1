"""A revision whose replica spans several pods, as a LeaderWorkerSet (kubernetes-sigs/lws, `leaderworkerset.x-k8s.io/v1`).

When a revision's ranks (tensorParallelSize × pipelineParallelSize) need more GPUs than one pod holds
(`folio.operator.serving.parallel`), `{isvc}-{rev}` is a LeaderWorkerSet instead of a Deployment: its
``replicas`` are the revision's replicas (groups: the autoscaler, KEDA, scale to zero and a canary's steps
count them, and whole groups come and go), each a group of ``size`` pods: a leader (node rank 0, the one
that serves HTTP) and workers (`folio serve --headless`). LeaderWorkerSet gives every container
``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE`` and ``LWS_WORKER_INDEX``, which `folio serve` reads for its
``--master-addr`` and ``--node-rank`` and checks against ``--nnodes``; pods are labelled
``leaderworkerset.sigs.k8s.io/worker-index`` ("0" on leaders), which the engine Service selects on so that
the routers and EndpointSlices see leaders only.

- ``restartPolicy: RecreateGroupOnPodRestart``: a rank lost takes its group down (the other ranks exit or
  hang in a collective), so a restart of any container recreates every pod of the group at once.
- ``startupPolicy: LeaderCreated``, not LeaderReady: the leader turns Ready (its /ready) only once every rank
  of its group has joined and loaded, and LeaderReady would create the workers only after that — never.
  Workers retry the rendezvous until the leader listens, so the order pods start in does not matter.
- ``networkConfig.subdomainPolicy: UniquePerReplica``: with the default (Shared), LeaderWorkerSet names its
  headless Service like the LeaderWorkerSet, i.e. like Folio's engine Service, which it then adopts as it
  is: leaders only, ready ones only, so the leader's address would not resolve until it is Ready, which
  needs the workers to have reached it. Per replica, its Services are ``{name}-{group}``, clear of ours.
"""

from __future__ import annotations

from typing import Any

from folio.operator.k8s.names import LEADER_WORKER_SET

Obj = dict[str, Any]

API_VERSION, KIND = LEADER_WORKER_SET
RESTART_POLICY = "RecreateGroupOnPodRestart"
STARTUP_POLICY = "LeaderCreated"
SUBDOMAIN_POLICY = "UniquePerReplica"
# A StatefulSet's pods carry `controller-revision-hash: {statefulset}-{hash of up to 10}`, a label value (at
# most 63 characters); LeaderWorkerSet names its workers' StatefulSets `{name}-{group}`. With up to 3 digits
# of group index, the LeaderWorkerSet's name must stay within 63 - 11 - 4 characters.
MAX_NAME_LENGTH = 48


def leader_worker_set(meta: Obj, labels: dict[str, str], *, replicas: int | None, size: int, leader: Obj,
                      worker: Obj) -> Obj:
    """The LeaderWorkerSet of ``replicas`` groups (None: KEDA owns the count) of ``size`` pods; ``leader``
    and ``worker`` are their pod specs."""
    spec: Obj = {
        "startupPolicy": STARTUP_POLICY,
        "networkConfig": {"subdomainPolicy": SUBDOMAIN_POLICY},
        "leaderWorkerTemplate": {
            "size": size,
            "restartPolicy": RESTART_POLICY,
            "leaderTemplate": {"metadata": {"labels": dict(labels)}, "spec": leader},
            "workerTemplate": {"metadata": {"labels": dict(labels)}, "spec": worker},
        },
    }
    if replicas is not None:
        spec = {"replicas": replicas, **spec}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec}
