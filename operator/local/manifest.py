"""Reading an InferenceService manifest for `folio up` and `folio apply`.

Kept light (yaml and pydantic are imported when a file is read) because `folio --help` imports
every command module.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from folio.operator.spec import InferenceService


class ManifestError(ValueError):
    """A manifest that cannot be used; the message is meant for the user as it is."""


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The one InferenceService document of a YAML file, as written (not validated: see
    `folio.operator.serving.validate.parse_manifest`); raises ManifestError when there is none."""
    import yaml

    from folio.operator.spec import KIND
    from folio.operator.yaml_load import load_all

    path = Path(path)
    try:
        docs = [d for d in load_all(path.read_text()) if d is not None]
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{path} is not UTF-8 text: {exc}") from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(found) != 1:
        raise ManifestError(f"{path} must hold exactly one {KIND} document, found {len(found)}")
    return found[0]


def load_manifest(path: str | Path) -> InferenceService:
    """Parse and validate an InferenceService YAML file (the `InferenceService` model)."""
    from pydantic import ValidationError

    from folio.operator.spec import InferenceService, describe_errors

    try:
        manifest = InferenceService.model_validate(read_manifest(path))
    except ValidationError as exc:
        raise ManifestError(f"{path}: {describe_errors(exc)}") from None
    if not manifest.name:
        raise ManifestError(f"{path}: metadata.name is required")
    return manifest
