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
    site = THIS_MACHINE if manifest.spec.model.scheme == "pkg" else CLUSTER  # where the example is meant to run
    assert validate(manifest.name, manifest.spec, site) == []


def test_faulty_example_is_a_new_revision_of_the_local_one() -> None:
    local, faulty = (
        load_manifest(EXAMPLES[0].with_name(n)) for n in ("smollm2-local.yaml", "smollm2-faulty.yaml")
    )
    assert local.name == faulty.name
    assert revision_name(local.spec) != revision_name(faulty.spec)


@pytest.mark.parametrize("name", ["smollm2-local.yaml", "smollm2-faulty.yaml"])
def test_the_local_examples_pin_the_file_their_source_names(name: str) -> None:
    """Their pkg:// source resolves on any machine with `make install` done, to the bytes the digest pins."""
    from folio.engine.digest import compute_digest
    from folio.engine.package_files import package_file

    model = load_manifest(EXAMPLES[0].with_name(name)).spec.model
    assert compute_digest(package_file(model.source)) == model.digest
