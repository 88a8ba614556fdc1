"""`helm lint` and `helm template` over several values sets; every object validated against Kubernetes' schemas."""

from __future__ import annotations

import argparse
import tarfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.chart import helm as h
from tests.chart.conftest import VALUE_SETS

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas available.
KUBE_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]
# Kinds with no schema in kubernetes-validate: checked against their own CRDs or by hand below.
CUSTOM_KINDS = {"ServiceMonitor", "KopfPeering", "ClusterKopfPeering"}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint(helm: str, name: str) -> None:
    h.lint(helm, VALUE_SETS[name])


@pytest.mark.parametrize("name", VALUE_SETS)
def test_objects_match_kubernetes_schemas(rendered: dict[str, list[h.Obj]], name: str) -> None:
    objects = rendered[name]
    assert objects
    checked = 0
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        for version in KUBE_VERSIONS:
            try:  # strict: an unknown or misspelt field fails too
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for {version}: {exc.message}")
        checked += 1
    assert checked and h.one(objects, "Deployment")


def test_peering_objects_match_kopf_crds(rendered: dict[str, list[h.Obj]]) -> None:
    crds = {c["spec"]["names"]["kind"]: c for c in yaml.safe_load_all((h.CHART / "crds" / "kopf-peering.yaml").read_text())}
    for name, expected_kind in [("peering-namespaced", "KopfPeering"), ("peering-cluster", "ClusterKopfPeering")]:
        peering = h.one(rendered[name], expected_kind)
        crd = crds[expected_kind]
        assert peering["apiVersion"] == f"{crd['spec']['group']}/{crd['spec']['versions'][0]['name']}"
        assert ("namespace" in peering["metadata"]) == (crd["spec"]["scope"] == "Namespaced")
        jsonschema.validate(peering, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    assert h.one(rendered["peering-namespaced"], "KopfPeering")["metadata"]["namespace"] == "models"
    assert h.one(rendered["peering-cluster"], "ClusterKopfPeering")["metadata"]["name"] == "folio-ha"
    assert not h.find(rendered["defaults"], "KopfPeering") + h.find(rendered["defaults"], "ClusterKopfPeering")


def _operator(objects: list[h.Obj]) -> h.Obj:
    return h.one(objects, "Deployment")


@pytest.mark.parametrize("name", VALUE_SETS)
def test_pods_are_locked_down(rendered: dict[str, list[h.Obj]], name: str) -> None:
    pods = [_operator(rendered[name])["spec"]["template"]["spec"]]
    pods += [p["spec"] for p in h.find(rendered[name], "Pod")]  # the helm test Pod
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_operator_args_are_accepted_by_folio_operator(rendered: dict[str, list[h.Obj]]) -> None:
    """Parse the rendered command line with the real `folio` parser, so a renamed flag fails here."""
    from folio.operator.cli import build_parser

    def parsed(name: str) -> argparse.Namespace:
        container = _operator(rendered[name])["spec"]["template"]["spec"]["containers"][0]
        args = build_parser().parse_args(container["args"])
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert (args.metrics_port, args.health_port) == (ports["metrics"], ports["health"])
        return args

    defaults = parsed("defaults")
    assert defaults.command == "operator"
    assert (defaults.namespace, defaults.all_namespaces, defaults.peering) == ([h.NAMESPACE], False, "")
    everywhere = parsed("all-namespaces")
    assert (everywhere.namespace, everywhere.all_namespaces, everywhere.peering) == ([], True, "")
    assert (parsed("peering-namespaced").namespace, parsed("peering-namespaced").peering) == (["models"], "folio")
    assert (parsed("peering-cluster").all_namespaces, parsed("peering-cluster").peering) == (True, "folio-ha")
    # two replicas heartbeat with a short lifetime, so that a standby takes over within seconds
    assert parsed("peering-namespaced").peering_lifetime == parsed("peering-cluster").peering_lifetime == 10
    assert parsed("observability").verbose is True  # from extraArgs
    assert (defaults.inference_pool, defaults.endpoint_picker_port) == (False, 9002)
    assert (parsed("observability").inference_pool, parsed("observability").endpoint_picker_port) == (True, 9100)
    assert (defaults.endpoint_picker_image, parsed("observability").endpoint_picker_image) == (
        "", "registry.example/epp:v1.0.0")
    assert parsed("observability").endpoint_picker_cluster_role == f"{h.RELEASE}-endpoint-picker"


def test_operator_deployment_wiring(rendered: dict[str, list[h.Obj]]) -> None:
    dep = _operator(rendered["observability"])
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == "registry.example/folio:1.2.3"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FOLIO_IMAGE"] == "registry.example/folio:1.2.3"  # routers and pre-pulls run the same image
    assert env["FOLIO_EXTRA"] == "1"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    # read-only root filesystem: /tmp is the only writable place, and HOME points there
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert env["HOME"] == "/tmp"
    # the pod template selects itself and the Deployment's selector matches it
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert dep["spec"]["strategy"]["type"] == "Recreate"  # never two active operators without peering
    assert _operator(rendered["peering-cluster"])["spec"]["strategy"]["type"] == "RollingUpdate"


def test_default_image_tag_is_the_app_version(rendered: dict[str, list[h.Obj]]) -> None:
    chart = yaml.safe_load((h.CHART / "Chart.yaml").read_text())
    image = _operator(rendered["defaults"])["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/folio-dev/folio:{chart['appVersion']}"


def test_disruption_budget_only_with_standbys(rendered: dict[str, list[h.Obj]]) -> None:
    assert not h.find(rendered["defaults"], "PodDisruptionBudget")
    pdb = h.one(rendered["peering-cluster"], "PodDisruptionBudget")
    labels = _operator(rendered["peering-cluster"])["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_bring_your_own_skips_crd_rbac_and_account(rendered: dict[str, list[h.Obj]]) -> None:
    objects = rendered["bring-your-own"]
    kinds = {o["kind"] for o in objects}
    assert "ServiceAccount" not in kinds and "Role" not in kinds and "RoleBinding" not in kinds
    assert [c["metadata"]["name"] for c in h.find(objects, "CustomResourceDefinition")] == [
        "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev",  # crds/ (skip with --skip-crds)
    ]
    assert _operator(objects)["spec"]["template"]["spec"]["serviceAccountName"] == "folio-operator"
    assert _operator(objects)["metadata"]["name"] == "folio"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"operator": {"replicas": 2, "peering": {"enabled": False}}}, "needs operator.peering"),
        ({"operator": {"allNamespaces": True, "watchNamespace": "x"}}, "only used when operator.allNamespaces is false"),
        # values.schema.json: a misspelt key or a wrong type is an error, not a silent default
        ({"operator": {"replica": 2}}, "additional properties 'replica' not allowed"),
        ({"image": {"pullPolicy": "Sometimes"}}, "value must be one of"),
        ({"operator": {"metricsPort": "http"}}, "got string, want integer"),
    ],
)
def test_impossible_values_are_refused(helm: str, values: h.Obj, message: str) -> None:
    with pytest.raises(h.HelmError, match=message):
        h.template(helm, values)


def test_helm_test_pod_targets_the_router(rendered: dict[str, list[h.Obj]]) -> None:
    assert not h.find(rendered["defaults"], "Pod")
    pod = h.one(rendered["observability"], "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    # the router Service is named after the InferenceService and listens on port 80
    assert env["FOLIO_URL"] == "http://chat.models.svc"
    assert env["FOLIO_MODEL"] == "smollm2"


def test_notes_render(helm: str) -> None:
    out = h.run(helm, ["install", "--dry-run=client", h.RELEASE, str(h.CHART), "--namespace", h.NAMESPACE],
                 {"tests": {"inferenceService": "chat"}})
    notes = out.split("NOTES:", 1)[1]
    assert f"rollout status deployment/{h.RELEASE}" in notes
    assert "kubectl -n folio-system wait --for=condition=Ready fisvc/chat" in notes
    assert "Deleting it deletes every InferenceService" in notes
    assert "helm test folio" in notes


def test_chart_files_are_packaged(helm: str, tmp_path: Path) -> None:
    """`helm package` keeps what the templates read (files/) and the docs."""
    h.run(helm, ["package", str(h.CHART), "--destination", str(tmp_path)])
    (archive,) = tmp_path.glob("folio-*.tgz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    for needed in ("files/crd.yaml", "files/crd-rolloutpolicies.yaml", "files/grafana-dashboard.json",
                   "crds/kopf-peering.yaml", "README.md",
                   "values.schema.json"):
        assert f"folio/{needed}" in names
