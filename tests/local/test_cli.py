"""The local commands' edges: bad manifests, nothing running, a taken port — clear errors, no tracebacks."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from folio.operator.cli import main

DIGEST = "sha256:" + "ab" * 32
GOOD_SPEC = f"""
apiVersion: serving.folio.dev/v1alpha1
kind: InferenceService
metadata: {{name: chat}}
spec:
  model: {{source: "file:///models/m", digest: "{DIGEST}"}}
"""


def folio(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "folio.operator.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=60,
        env=env,
    )  # fmt: skip


BAD_MANIFESTS = {
    "not yaml": ("spec: [unclosed", "not valid YAML"),
    "no document": ("kind: ConfigMap\n", "exactly one InferenceService"),
    "no digest": (GOOD_SPEC.replace(f', digest: "{DIGEST}"', ""), "need model.digest"),
    "no name": (GOOD_SPEC.replace("metadata: {name: chat}", "metadata: {}"), "metadata.name is required"),
    "bad weights": (GOOD_SPEC + "  rollout: {steps: [{weight: 50}, {weight: 20}]}\n", "strictly increase"),
    "pvc source": (GOOD_SPEC.replace('"file:///models/m"', "pvc://claim/m"), "pvc:// sources need a cluster"),
    "unknown engine arg": (
        GOOD_SPEC + "  engine: {args: {maxModelLenn: 5}}\n",
        "unknown engine arg 'maxModelLenn'",
    ),
    "unknown field": (GOOD_SPEC + "  replicaz: 2\n", "spec.replicaz: Extra inputs are not permitted"),
    # names the API server (or Folio's children's names) would refuse
    "bad name": (GOOD_SPEC.replace("{name: chat}", "{name: Bad_Name!}"), "must be at most 44 lower-case"),
    "path name": (GOOD_SPEC.replace("{name: chat}", '{name: "../../etc"}'), "must be at most 44 lower-case"),
    "long name": (GOOD_SPEC.replace("{name: chat}", "{name: " + "a" * 300 + "}"), "must be at most 44"),
    "too many replicas": (GOOD_SPEC + "  replicas: 100000\n", "less than or equal to 512"),
    "more replicas than one machine runs": (GOOD_SPEC + "  replicas: 17\n", "at most 16 engine processes"),
    # engine args `folio serve` itself would refuse: a planning error naming the arg, not a crash loop
    "zero maxNumSeqs": (GOOD_SPEC + "  engine: {args: {maxNumSeqs: 0}}\n", "spec.engine.args.maxNumSeqs"),
    "negative maxNumSeqs": (GOOD_SPEC + "  engine: {args: {maxNumSeqs: -5}}\n", "spec.engine.args.maxNumSeqs"),
    "zero blockSize": (GOOD_SPEC + "  engine: {args: {blockSize: 0}}\n", "spec.engine.args.blockSize"),
    "huge maxModelLen": (GOOD_SPEC + "  engine: {args: {maxModelLen: 1000000000000}}\n", "spec.engine.args.maxModelLen"),
    "negative kv cache": (GOOD_SPEC + "  engine: {args: {kvCacheMemoryGib: -1}}\n", "spec.engine.args.kvCacheMemoryGib"),
    "negative shutdown": (GOOD_SPEC + "  engine: {args: {shutdownTimeout: -1}}\n", "spec.engine.args.shutdownTimeout"),
    "zero maxN": (GOOD_SPEC + "  engine: {args: {maxN: 0}}\n", "spec.engine.args.maxN"),
    "alias bomb": (
        GOOD_SPEC + "  engine: {env: [{name: A, value: x}]}\nx0: &x0 [a, a, a, a, a, a, a, a, a, a]\n"
        + "".join(f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 10)}]\n" for i in range(1, 9)),
        "expands to more than 100000 nodes",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_MANIFESTS))
def test_up_refuses_bad_manifests(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text, message = BAD_MANIFESTS[case]
    (tmp_path / "m.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["up", "m.yaml", "--port", "1"]) == 1  # in process: any exception would fail the test
    assert message in capsys.readouterr().err
    assert not (tmp_path / ".folio").exists()  # refused before touching any state


def test_a_bad_manifest_prints_no_traceback(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(BAD_MANIFESTS["no digest"][0])
    out = folio("up", "m.yaml", cwd=tmp_path)
    assert out.returncode == 1 and "need model.digest" in out.stderr and "Traceback" not in out.stderr


def test_up_refuses_missing_file_and_taken_port(tmp_path: Path) -> None:
    out = folio("up", "nope.yaml", cwd=tmp_path)
    assert out.returncode == 1 and "cannot read nope.yaml" in out.stderr
    (tmp_path / "m.yaml").write_text(GOOD_SPEC)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        out = folio("up", "m.yaml", "--port", str(s.getsockname()[1]), cwd=tmp_path)
    assert out.returncode == 1 and "not available" in out.stderr and "Traceback" not in out.stderr


def test_apply_without_a_running_up(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(GOOD_SPEC)
    out = folio("apply", "m.yaml", cwd=tmp_path)
    assert out.returncode == 1
    assert "no running `folio up`" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("argv", [["status"], ["status", "chat", "-o", "json"], ["promote", "chat"]])
def test_no_local_up_and_no_cluster(tmp_path: Path, argv: list[str]) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "missing")}
    out = folio(*argv, cwd=tmp_path, env=env)
    assert out.returncode == 1
    assert "no Kubernetes cluster configured" in out.stderr and "Traceback" not in out.stderr
