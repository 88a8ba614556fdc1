"""The local commands' edges: bad manifests, nothing running, a taken port — clear errors, no tracebacks."""

from __future__ import annotations

import json
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
    "unknown field": (GOOD_SPEC + "  replicaz: 2\n",
                      "spec.replicaz: Extra inputs are not permitted (did you mean 'replicas'?)"),
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


# ------------------------------------------------------------------- one line per problem, no markup


def test_up_refuses_a_markup_like_overflow_url_in_one_line(tmp_path: Path) -> None:
    """rich used to read the refusal's own regex as markup (MarkupError: closing tag '[/?#]' ...)."""
    (tmp_path / "m.yaml").write_text(GOOD_SPEC + '  overflow: {url: "ftp://x"}\n')
    out = folio("up", "m.yaml", cwd=tmp_path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.splitlines() == [
        "folio up: spec.overflow.url: must be an http:// or https:// URL with a host, got 'ftp://x'"
    ]
    assert not (tmp_path / ".folio").exists()


def test_up_prints_each_problem_on_a_line_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = GOOD_SPEC.replace("{name: chat}", '{name: "[bold]x"}') + (
        "  replicas: 17\n  engine: {args: {maxNumSeqs: 0, '[/?#]': 1}}\n"
        "  rollout: {parity: {configMapRef: {name: suite}}}\n"
    )
    (tmp_path / "m.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["up", "m.yaml", "--dry-run"]) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4, lines
    assert lines[0].startswith("folio up: metadata.name '[bold]x' must be at most 44 lower-case letters")
    assert lines[1].startswith("folio up: spec.engine.args['[/?#]']: unknown engine arg '[/?#]' (known args: ")
    assert lines[2] == "folio up: spec.replicas 17 is more than `folio up` runs (at most 16 engine processes per revision)"
    assert lines[3].startswith("folio up: spec.rollout.parity.configMapRef needs a cluster")
    assert not (tmp_path / ".folio").exists()


def test_up_dry_run_prints_the_plan_and_starts_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from folio.operator.spec import InferenceServiceSpec, revision_name

    text = GOOD_SPEC + "  replicas: 2\n  engine: {args: {maxModelLen: 512}}\n  overflow: {url: 'https://spill.example/v1'}\n"
    (tmp_path / "m.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["up", "m.yaml", "--dry-run", "--port", "18080"]) == 0
    out = capsys.readouterr().out
    spec = {"model": {"source": "file:///models/m", "digest": DIGEST}, "engine": {"args": {"maxModelLen": 512}}}
    rev = revision_name(InferenceServiceSpec.model_validate(spec))
    weights = f"{tmp_path / '.folio' / 'cache' / rev / 'm'}"
    assert f"revision {rev} (Stable) serving file:///models/m as 'chat'" in out
    assert f"pre-pulled from file:///models/m into {weights} and verified against {DIGEST}" in out
    assert "engines: 2 replica(s)" in out
    assert (
        f"folio serve --model {weights} --served-model-name chat --host 127.0.0.1 --port PORT --digest {DIGEST} "
        "--max-model-len 512"
    ) in out
    assert "router: http://127.0.0.1:18080/v1" in out
    router = json.loads(out[out.index("\n  {") :])  # the router's config, as `folio up` would write it
    assert router["traffic"] == [{"revision": rev, "weight": 100}] and router["stable"] == rev
    assert router["overflow"] == {"url": "https://spill.example"}
    assert not (tmp_path / ".folio").exists()  # nothing written, not even the state folder


def test_up_dry_run_refuses_what_up_refuses(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(GOOD_SPEC.replace('"file:///models/m"', "pvc://claim/m"))
    out = folio("up", "m.yaml", "--dry-run", cwd=tmp_path)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "folio up: spec.model.source: pvc:// sources need a cluster; `folio up` serves hf://, file://, pkg:// sources"
    ]


def test_apply_refuses_with_one_line_per_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.yaml").write_text(GOOD_SPEC + "  overflow: {url: 'ftp://x'}\n  replicaz: 2\n")
    assert main(["apply", str(tmp_path / "m.yaml"), "--state-dir", str(tmp_path / "none")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "folio apply: spec.overflow.url: must be an http:// or https:// URL with a host, got 'ftp://x'",
        "folio apply: spec.replicaz: Extra inputs are not permitted (did you mean 'replicas'?)",
    ]


def test_apply_prints_a_refusal_from_folio_up_line_by_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from folio.operator.local import client

    class Refusing:
        def apply(self, manifest: dict[str, object]) -> dict[str, object]:
            raise client.ControlError("metadata.name: this `folio up` runs 'other'\nspec.replicas: too many")

    monkeypatch.setattr(client.LocalClient, "find", classmethod(lambda cls, state_dir: Refusing()))
    (tmp_path / "m.yaml").write_text(GOOD_SPEC)
    assert main(["apply", str(tmp_path / "m.yaml")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "folio apply: metadata.name: this `folio up` runs 'other'",
        "folio apply: spec.replicas: too many",
    ]


def test_the_status_table_prints_names_and_messages_literally() -> None:
    from io import StringIO

    from rich.console import Console

    from folio.operator.local.render import status_table
    from folio.operator.spec import InferenceServiceStatus

    status = InferenceServiceStatus.model_validate({
        "phase": "Ready",
        "revisions": [{"name": "[bold]r1", "role": "Stable", "weightsReady": True, "image": "[/?#]",
                       "model": {"source": "file:///[/?#]", "digest": DIGEST}, "args": {"servedX": "[/]"}}],
        "traffic": [{"revision": "[bold]r1", "weight": 100}],
        "conditions": [{"type": "Degraded", "status": "True", "reason": "[red]", "message": "url [/?#] refused [/] :smile:"}],
        "failedRevisions": [{"revision": "[i]r0", "reason": "Failed", "at": "now", "message": "[bold]boom[/bold]"}],
    })  # fmt: skip
    console = Console(file=StringIO(), width=300, color_system=None)
    console.print(status_table("[bold]chat[/]", status, None))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    for literal in ("InferenceService [bold]chat[/] — Ready", "[bold]r1", "servedX=[/]", "file:///[/?#]", "[red]",
                    "url [/?#] refused [/] :smile:", "[i]r0", "[bold]boom[/bold]"):
        assert literal in out, literal
