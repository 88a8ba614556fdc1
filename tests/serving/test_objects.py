"""The serving plan as Kubernetes objects: every object it produces, independent of any API server.

Each object is also checked against Kubernetes' own 1.30 schemas (kubernetes-validate, strict),
which the emulator in the integration tests does not do.
"""

from __future__ import annotations

import kubernetes_validate

from folio.operator.prepull import weights_path
from folio.operator.spec import InferenceServiceSpec, revision_name
from tests.serving.helpers import COMMIT, DIGEST, make_spec, objects_by_key, planned, revision


def test_every_object_is_valid_kubernetes_with_owner_and_labels(spec: InferenceServiceSpec) -> None:
    objs = objects_by_key(spec, revision(spec, weights_ready=False))
    for obj in objs.values():
        kubernetes_validate.validate(obj, "1.30", strict=True)
        meta = obj["metadata"]
        assert meta["namespace"] == "ml"
        assert meta["ownerReferences"] == [{
            "apiVersion": "serving.folio.dev/v1alpha1", "kind": "InferenceService", "name": "chat",
            "uid": "uid-1", "controller": True, "blockOwnerDeletion": True,
        }]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "folio"
        assert meta["labels"]["app.kubernetes.io/instance"] == "chat"
        assert meta["labels"]["serving.folio.dev/inferenceservice"] == "chat"


def test_object_set_for_one_revision(spec: InferenceServiceSpec) -> None:
    rev = revision_name(spec)
    assert set(objects_by_key(spec, revision(spec, weights_ready=False))) == {
        ("PersistentVolumeClaim", "chat-weights"),
        ("Job", f"chat-prepull-{rev}"),
        ("Deployment", f"chat-{rev}"),
        ("Service", f"chat-{rev}"),
        ("ServiceAccount", "chat-router"),
        ("RoleBinding", "chat-router"),
        ("Deployment", "chat"),
        ("Service", "chat"),
        ("PodDisruptionBudget", "chat-engine"),
        ("PodDisruptionBudget", "chat-router"),
        ("NetworkPolicy", "chat-engine"),
    }
    # Once the weights are verified, the pre-pull Job is no longer wanted.
    assert ("Job", f"chat-prepull-{rev}") not in objects_by_key(spec, revision(spec))


def test_engine_deployment(spec: InferenceServiceSpec) -> None:
    rev = revision_name(spec)
    dep = objects_by_key(spec, revision(spec))[("Deployment", f"chat-{rev}")]
    assert dep["spec"]["replicas"] == 3
    assert dep["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"
    assert dep["metadata"]["labels"]["serving.folio.dev/revision"] == rev
    assert dep["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/instance": "chat", "app.kubernetes.io/component": "engine",
        "serving.folio.dev/revision": rev,
    }
    pod = dep["spec"]["template"]
    assert pod["metadata"]["labels"] == dep["metadata"]["labels"]
    (c,) = pod["spec"]["containers"]
    assert c["image"] == "registry.example/folio:1"
    assert c["command"] == ["folio", "serve"]
    assert c["args"] == [
        "--model", f"/weights/{rev}/SmolLM2-135M-Instruct", "--served-model-name", "chat",
        "--host", "0.0.0.0", "--port", "8000", "--metrics-port", "8001", "--revision", COMMIT, "--digest", DIGEST,
        "--no-enable-prefix-caching", "--gpu-memory-utilization", "0.8", "--max-model-len", "4096",
    ]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    # /metrics alone on a port of its own: the NetworkPolicy admits scrapers there and not to the API
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"},
                          {"name": "metrics", "containerPort": 8001, "protocol": "TCP"}]
    startup = c["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60  # big models load slowly
    assert c["readinessProbe"]["httpGet"]["path"] in ("/health", "/ready")
    assert c["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert {"name": "weights", "mountPath": "/weights", "readOnly": True} in c["volumeMounts"]
    assert c["env"][-1] == {"name": "LOG_LEVEL", "value": "debug"}  # after the cache dirs (tests/serving/test_pod_security.py)
    assert "HF_TOKEN" not in str(dep), "the hub token never reaches serving pods"
    ps = pod["spec"]
    assert {"name": "weights", "persistentVolumeClaim": {"claimName": "chat-weights", "readOnly": True}} in ps["volumes"]
    assert ps["nodeSelector"] == {"gpu": "h100"}
    assert ps["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert ps["priorityClassName"] == "inference"
    assert ps["terminationGracePeriodSeconds"] >= 60
    assert ps["automountServiceAccountToken"] is False


def test_no_serving_pods_before_weights_are_verified(spec: InferenceServiceSpec) -> None:
    rev = revision_name(spec)
    dep = objects_by_key(spec, revision(spec, weights_ready=False))[("Deployment", f"chat-{rev}")]
    assert dep["spec"]["replicas"] == 0


def test_engine_service_is_headless(spec: InferenceServiceSpec) -> None:
    rev = revision_name(spec)
    svc = objects_by_key(spec, revision(spec))[("Service", f"chat-{rev}")]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"},
                                    {"name": "metrics", "port": 8001, "targetPort": "metrics", "protocol": "TCP"}]
    assert svc["spec"]["selector"]["serving.folio.dev/revision"] == rev


def test_prepull_job_fills_what_the_engine_serves(spec: InferenceServiceSpec) -> None:
    # The Job itself is folio.operator.prepull's; here: it is planned, owned, and agrees with the engine.
    rev = revision_name(spec)
    objs = objects_by_key(spec, revision(spec, weights_ready=False))
    job = objs[("Job", f"chat-prepull-{rev}")]
    engine_args = objs[("Deployment", f"chat-{rev}")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "prepull"
    assert job["metadata"]["labels"]["serving.folio.dev/revision"] == rev
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (c,) = pod["containers"]
    assert c["image"] == "registry.example/folio-operator:1"
    args = c["args"]
    assert args[args.index("--revision") + 1] == COMMIT
    assert args[args.index("--digest") + 1] == DIGEST
    assert args[args.index("--dest") + 1] == engine_args[engine_args.index("--model") + 1]
    assert args[args.index("--dest") + 1] == weights_path(rev, spec.model)
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}} in c["env"]
    assert {"name": "weights", "mountPath": "/weights"} in c["volumeMounts"]  # the one writer of the cache


def test_prepull_from_a_pvc_mounts_the_source_read_only() -> None:
    spec = make_spec(model={"source": "pvc://models/llama/v3", "digest": DIGEST})
    rev = revision_name(spec)
    job = objects_by_key(spec, revision(spec, weights_ready=False))[("Job", f"chat-prepull-{rev}")]
    pod = job["spec"]["template"]["spec"]
    assert {"name": "source", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod["volumes"]
    assert "--revision" not in pod["containers"][0]["args"]
    assert weights_path(rev, spec.model) == f"/weights/{rev}/v3"


def test_weights_pvc(spec: InferenceServiceSpec) -> None:
    pvc = objects_by_key(spec, revision(spec))[("PersistentVolumeClaim", "chat-weights")]
    assert pvc["spec"]["resources"] == {"requests": {"storage": "50Gi"}}
    assert pvc["spec"]["storageClassName"] == "nfs"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # engines on many nodes share the cache


def test_router(spec: InferenceServiceSpec) -> None:
    objs = objects_by_key(spec, revision(spec))
    dep = objs[("Deployment", "chat")]
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "chat-router"
    (c,) = pod["containers"]
    assert c["command"] == ["folio", "router"]
    assert c["args"] == ["--name", "chat", "--kubernetes", "--namespace", "ml", "--port", "8080"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    svc = objs[("Service", "chat")]
    assert svc["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    assert svc["spec"]["selector"] == {"app.kubernetes.io/instance": "chat", "app.kubernetes.io/component": "router"}


def test_router_rbac_binds_the_charts_cluster_role_and_mounts_the_overflow_key(spec: InferenceServiceSpec) -> None:
    objs = objects_by_key(spec, revision(spec))
    assert not [k for k in objs if k[0] in ("Role", "ClusterRole")]  # the operator grants nothing of its own
    binding = objs[("RoleBinding", "chat-router")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "folio-router"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "chat-router", "namespace": "ml"}]
    # The overflow key: a Secret volume the kubelet fills, optional so a missing Secret never blocks the pod.
    pod = objs[("Deployment", "chat")]["spec"]["template"]["spec"]
    (key_volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert key_volume["secret"] == {"secretName": "overflow-key", "optional": True,
                                    "items": [{"key": "token", "path": "api-key"}]}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == key_volume["name"])
    assert mount == {"name": key_volume["name"], "mountPath": "/var/run/secrets/folio.dev/overflow", "readOnly": True}
    bare = make_spec(overflow=None)
    pod = objects_by_key(bare, revision(bare))[("Deployment", "chat")]["spec"]["template"]["spec"]
    assert not [v for v in pod["volumes"] if "secret" in v]


def test_disruption_budgets(spec: InferenceServiceSpec) -> None:
    objs = objects_by_key(spec, revision(spec))
    for component in ("engine", "router"):
        pdb = objs[("PodDisruptionBudget", f"chat-{component}")]
        assert pdb["spec"]["maxUnavailable"] == 1
        assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == component


def test_each_running_revision_gets_its_own_engine(spec: InferenceServiceSpec) -> None:
    canary_spec = make_spec(engine={"image": "registry.example/folio:2"})
    stable, canary = revision(spec, "Stable"), revision(canary_spec, "Canary", weights_ready=False)
    failed = revision(make_spec(engine={"image": "registry.example/folio:bad"}), "Failed")
    objs = objects_by_key(canary_spec, stable, canary, failed)
    assert objs[("Deployment", f"chat-{stable.name}")]["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "registry.example/folio:1"
    )
    assert objs[("Deployment", f"chat-{canary.name}")]["spec"]["replicas"] == 0
    assert ("Job", f"chat-prepull-{canary.name}") in objs
    assert ("Job", f"chat-prepull-{stable.name}") not in objs
    assert not any(failed.name in name for _, name in objs), "a failed revision runs nothing"


def test_replicas_change_the_deployment_not_the_revision(spec: InferenceServiceSpec) -> None:
    scaled = make_spec(replicas=5)
    assert revision_name(scaled) == revision_name(spec)
    dep = objects_by_key(scaled, revision(spec))[("Deployment", f"chat-{revision_name(spec)}")]
    assert dep["spec"]["replicas"] == 5


def test_plan_is_deterministic(spec: InferenceServiceSpec) -> None:
    assert planned(spec, revision(spec)) == planned(spec, revision(spec))


def test_grace_period_covers_the_engine_drain() -> None:
    spec = make_spec(engine={"args": {"shutdownTimeout": 300}})
    dep = objects_by_key(spec, revision(spec))[("Deployment", f"chat-{revision_name(spec)}")]
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 300 + 10
