"""The content digest shared by `folio digest`, the pre-pull and the engine loader."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from folio.engine.digest import DigestMismatchError, compute_digest, verify_digest


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "model"
    (root / "sub").mkdir(parents=True)
    (root / "config.json").write_text('{"a": 1}')
    (root / "model.safetensors").write_bytes(b"\x00\x01" * 1000)
    (root / "sub" / "extra.bin").write_bytes(b"xyz")
    (root / ".cache").mkdir()
    (root / ".cache" / "ignored").write_text("noise")
    return root


def test_single_file_digest_is_plain_sha256(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"weights" * 100)
    assert compute_digest(f) == "sha256:" + hashlib.sha256(b"weights" * 100).hexdigest()


def test_folder_digest_is_documented_manifest(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    lines = (
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {rel}\n"
        for rel, p in [("config.json", root / "config.json"), ("model.safetensors", root / "model.safetensors"),
                       ("sub/extra.bin", root / "sub" / "extra.bin")]
    )
    expected = "sha256:" + hashlib.sha256("".join(lines).encode()).hexdigest()
    assert compute_digest(root) == expected


def test_folder_digest_ignores_hidden_and_order(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    before = compute_digest(root)
    (root / ".cache" / "more").write_text("more noise")
    assert compute_digest(root) == before
    (root / "sub" / "extra.bin").write_bytes(b"xyZ")
    assert compute_digest(root) != before


def test_verify_refuses_mismatch(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    good = compute_digest(root)
    assert verify_digest(root, good) == good
    with pytest.raises(DigestMismatchError, match="do not match the pinned digest"):
        verify_digest(root, "sha256:" + "0" * 64)
    with pytest.raises(ValueError, match="malformed digest"):
        verify_digest(root, "md5:abc")


def test_progress_reaches_total(tmp_path: Path) -> None:
    root = _folder(tmp_path)
    seen: list[tuple[int, int]] = []
    compute_digest(root, lambda done, total: seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] > 0


def test_cli_prints_digest(tmp_path: Path, folio_bin: str) -> None:
    root = _folder(tmp_path)
    out = subprocess.run([folio_bin, "digest", str(root)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == compute_digest(root)
    missing = subprocess.run([folio_bin, "digest", str(tmp_path / "nope")], capture_output=True, text=True)
    assert missing.returncode == 1 and "no such file" in missing.stderr
