"""The state folder: round trips, the single-writer lock, the control file's permissions."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from folio.operator.local.state import SavedState, StateDir, StateError
from folio.operator.spec import InferenceService, InferenceServiceStatus, TrafficTarget

DIGEST = "sha256:" + "ab" * 32


def manifest(name: str = "chat") -> InferenceService:
    return InferenceService.model_validate(
        {"metadata": {"name": name}, "spec": {"model": {"source": "file:///m", "digest": DIGEST}}}
    )


def test_state_round_trips(tmp_path: Path) -> None:
    d = StateDir(tmp_path / "st")
    assert d.load() is None
    status = InferenceServiceStatus(stable_revision="r1", traffic=[TrafficTarget(revision="r1", weight=100)])
    d.save(SavedState(manifest=manifest(), generation=3, status=status, overrides={"promote"}))
    back = StateDir(tmp_path / "st").load()
    assert back is not None
    assert back.manifest == manifest() and back.generation == 3 and back.overrides == {"promote"}
    assert back.status.traffic == status.traffic and back.status.stable_revision == "r1"


def test_corrupt_state_is_a_clear_error(tmp_path: Path) -> None:
    d = StateDir(tmp_path)
    d.create()
    d.state_file.write_text("{not json")
    with pytest.raises(StateError, match="remove the folder"):
        d.load()


def test_one_up_per_state_folder(tmp_path: Path) -> None:
    first, second = StateDir(tmp_path), StateDir(tmp_path)
    assert not first.is_locked()
    first.lock()
    try:
        assert second.is_locked()
        with pytest.raises(StateError, match="already running"):
            second.lock()
    finally:
        first.unlock()
    assert not second.is_locked()
    second.lock()
    second.unlock()


def test_control_file_is_private(tmp_path: Path) -> None:
    d = StateDir(tmp_path)
    d.write_control("http://127.0.0.1:1234", "secret")
    assert stat.S_IMODE(d.control_file.stat().st_mode) == 0o600
    assert d.read_control() == {
        "url": "http://127.0.0.1:1234",
        "token": "secret",
        "pid": d.read_control()["pid"],
    }
    d.clear_control()
    assert d.read_control() is None
