"""Content digests of model weights: the one implementation behind `folio digest`, the
pre-pull's verification and the engine loader's pin check.

Definition (order-independent, stable across machines):
- a single file: ``sha256:`` + the SHA-256 of its bytes (what ``sha256sum FILE`` prints);
- a folder: every regular file below it whose path has no component starting with ``.``
  (so ``.cache/`` and ``.git/`` are ignored) contributes one manifest line
  ``<sha256 of the file's bytes>  <path relative to the folder, with />``; the lines are sorted
  by path, joined with ``\\n`` (each line ending in one), and the digest is ``sha256:`` + the
  SHA-256 of that manifest. File names are part of the digest; modification times are not.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from collections.abc import Callable
from pathlib import Path

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
_CHUNK = 4 << 20

# progress(bytes_done, bytes_total)
Progress = Callable[[int, int], None]


class DigestMismatchError(ValueError):
    """The weights on disk are not the pinned ones."""


def weight_files(root: Path) -> list[Path]:
    """The files a folder's digest covers, sorted by their relative path."""
    files = [
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _file_sha256(path: Path, on_bytes: Callable[[int], None]) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            on_bytes(len(chunk))
    return h.hexdigest()


def compute_digest(path: str | Path, progress: Progress | None = None) -> str:
    """Return the ``sha256:…`` content digest of a weight file or folder."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"no such file or folder: {root}")
    files = [root] if root.is_file() else weight_files(root)
    if not files:
        raise ValueError(f"{root} holds no files to digest")
    total = sum(f.stat().st_size for f in files)
    done = 0

    def on_bytes(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, total)

    if root.is_file():
        return "sha256:" + _file_sha256(root, on_bytes)
    manifest = "".join(f"{_file_sha256(f, on_bytes)}  {f.relative_to(root).as_posix()}\n" for f in files)
    return "sha256:" + hashlib.sha256(manifest.encode()).hexdigest()


def verify_digest(path: str | Path, expected: str, progress: Progress | None = None) -> str:
    """Compute the digest of ``path`` and raise :class:`DigestMismatchError` unless it is ``expected``."""
    if not DIGEST_RE.match(expected):
        raise ValueError(f"malformed digest {expected!r}: expected 'sha256:' and 64 lowercase hex digits")
    actual = compute_digest(path, progress)
    if actual != expected:
        raise DigestMismatchError(
            f"weights at {path} do not match the pinned digest: expected {expected}, found {actual}"
        )
    return actual


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", help="a weight file (e.g. .gguf), a Hugging Face style model folder, or pkg://DISTRIBUTION/PATH"
    )


def main(args: argparse.Namespace) -> int:
    from folio.engine.package_files import local_path

    try:
        print(compute_digest(local_path(args.path)))
    except (OSError, ValueError) as exc:
        print(f"folio digest: {exc}", file=sys.stderr)
        return 1
    return 0
