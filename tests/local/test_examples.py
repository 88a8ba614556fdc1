"""The sample manifests in examples/ stay valid as the spec evolves."""

from __future__ import annotations

from pathlib import Path

import pytest

from folio.operator.local.manifest import load_manifest
from folio.operator.serving.validate import CLUSTER, THIS_MACHINE, validate
from folio.operator.spec import revision_name

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_a_valid_inferenceservice(path: Path) -> None:
    manifest = load_manifest(path)
    site = THIS_MACHINE if manifest.spec.model.scheme == "file" else CLUSTER  # where the example is meant to run
    assert validate(manifest.name, manifest.spec, site) == []


def test_faulty_example_is_a_new_revision_of_the_local_one() -> None:
    local, faulty = (
        load_manifest(EXAMPLES[0].with_name(n)) for n in ("smollm2-local.yaml", "smollm2-faulty.yaml")
    )
    assert local.name == faulty.name
    assert revision_name(local.spec) != revision_name(faulty.spec)


def test_the_local_examples_one_liner_finds_the_file_its_digest_pins() -> None:
    # the comment's command, run as written (with this interpreter): the file it prints is the pinned one
    import shlex
    import subprocess
    import sys

    from folio.engine.digest import compute_digest

    path = EXAMPLES[0].with_name("smollm2-local.yaml")
    line = next(raw.removeprefix("#").strip() for raw in path.read_text().splitlines()
                if raw.lstrip("# ").startswith("python -c"))
    argv = shlex.split(line)
    assert argv[0] == "python"
    out = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    found = Path(out.stdout.strip())
    assert found.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert compute_digest(found) == load_manifest(path).spec.model.digest
