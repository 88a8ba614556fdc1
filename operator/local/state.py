"""The local runtime's state folder (default `.folio/` in the working directory).

Everything a restarted `folio up` needs to resume the same revisions lives here, next to what the
other commands need to find it:

    state.json     the applied manifest, its generation, the status (revisions, traffic, canary)
                   and pending manual overrides; rewritten atomically after every change
    control.json   where the running `folio up` listens, its pid and the bearer token (mode 0600)
    router.json    the router's config (traffic + endpoints), followed by `folio router --config`
    up.lock        flock held by the running `folio up`, so two never share a folder
    cache/         verified weights, one folder per revision (same weights are hard-linked)
    logs/          one log file per engine replica and for the router
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from folio.operator.local.target import DEFAULT_STATE_DIR
from folio.operator.spec import InferenceService, InferenceServiceStatus


class StateError(RuntimeError):
    """The state folder cannot be used (locked by another `folio up`, unreadable, …)."""


def write_json_atomic(path: Path, data: Any, *, mode: int = 0o644) -> None:
    """Write JSON so readers (the router, other commands) never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass
class SavedState:
    """What `folio up` persists between runs."""

    manifest: InferenceService
    generation: int = 1
    status: InferenceServiceStatus = field(default_factory=InferenceServiceStatus)
    overrides: set[str] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest.model_dump(mode="json", by_alias=True, exclude_none=True),
            "generation": self.generation,
            "status": self.status.to_wire(),
            "overrides": sorted(self.overrides),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SavedState:
        return cls(
            manifest=InferenceService.model_validate(data["manifest"]),
            generation=int(data.get("generation", 1)),
            status=InferenceServiceStatus.model_validate(data.get("status") or {}),
            overrides=set(data.get("overrides", [])),
        )


class StateDir:
    """Paths in the state folder and the small amount of I/O on them."""

    def __init__(self, root: str | Path = DEFAULT_STATE_DIR) -> None:
        self.root = Path(root).resolve()
        self._lock_file: TextIO | None = None

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def control_file(self) -> Path:
        return self.root / "control.json"

    @property
    def router_config(self) -> Path:
        return self.root / "router.json"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    def create(self) -> None:
        for d in (self.root, self.cache_dir, self.logs_dir):
            d.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ the lock

    def lock(self) -> None:
        """Take the folder for this process; raises StateError when another `folio up` holds it."""
        self.create()
        f = (self.root / "up.lock").open("a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise StateError(
                f"another `folio up` is already running with state folder {self.root}; "
                "stop it or pass a different --state-dir"
            ) from None
        self._lock_file = f

    def unlock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def is_locked(self) -> bool:
        """True while some `folio up` holds the folder (a crashed one releases it with its death)."""
        path = self.root / "up.lock"
        if not path.exists():
            return False
        with path.open("a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False

    # ----------------------------------------------------------- documents

    def load(self) -> SavedState | None:
        if not self.state_file.exists():
            return None
        try:
            return SavedState.from_json(json.loads(self.state_file.read_text()))
        except (OSError, ValueError, KeyError) as exc:
            raise StateError(
                f"cannot read {self.state_file}: {exc}; remove the folder to start afresh"
            ) from exc

    def save(self, state: SavedState) -> None:
        write_json_atomic(self.state_file, state.to_json())

    def write_control(self, url: str, token: str) -> None:
        # 0600: the token lets its holder promote or abort rollouts
        write_json_atomic(self.control_file, {"url": url, "token": token, "pid": os.getpid()}, mode=0o600)

    def read_control(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.control_file.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and "url" in data else None

    def clear_control(self) -> None:
        self.control_file.unlink(missing_ok=True)
