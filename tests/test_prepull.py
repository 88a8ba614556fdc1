"""Pre-pull: pinned weights fetched into the cache, verified, reused (the Job that runs it: tests/serving)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from folio.engine.digest import compute_digest
from folio.operator.prepull import RECORD, WeightsError, main, model_dir_name, prepull, read_record
from folio.operator.spec import ModelSource

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    """A small model folder: config, two shards, and a hidden folder the digest ignores."""
    folder = tmp_path / "src" / "tiny-model"
    (folder / ".git").mkdir(parents=True)
    (folder / ".git" / "HEAD").write_text("ignored")
    (folder / "config.json").write_text('{"hidden_size": 64}')
    (folder / "model-00001.safetensors").write_bytes(os.urandom(50_000))
    (folder / "sub").mkdir()
    (folder / "sub" / "model-00002.safetensors").write_bytes(os.urandom(30_000))
    return folder


def file_model(path: Path, digest: str) -> ModelSource:
    return ModelSource(source=f"file://{path}", digest=digest)


def test_good_file_source_is_copied_verified_and_recorded(weights: Path, tmp_path: Path) -> None:
    digest = compute_digest(weights)
    dest = tmp_path / "cache" / "rev1" / "tiny-model"
    stages: set[str] = set()
    pulled = prepull(file_model(weights, digest), dest, progress=lambda stage, done, total: stages.add(stage))
    assert pulled.path == dest and not pulled.reused
    assert pulled.digest == digest == compute_digest(pulled.path)
    assert not (pulled.path / ".git").exists()
    assert read_record(dest) == {"source": f"file://{weights}", "revision": None, "digest": digest, "model": "tiny-model"}
    assert stages == {"copy", "verify"}
    assert sorted(p.name for p in dest.parent.iterdir()) == [RECORD, "tiny-model"]


def test_digest_mismatch_is_refused_and_nothing_is_left_to_serve(weights: Path, tmp_path: Path) -> None:
    wrong = "sha256:" + "0" * 64
    dest = tmp_path / "cache" / "rev1" / "tiny-model"
    with pytest.raises(WeightsError) as err:
        prepull(file_model(weights, wrong), dest)
    message = str(err.value)
    assert "digest mismatch" in message and wrong in message and compute_digest(weights) in message
    assert list(dest.parent.iterdir()) == [], "no weights, no record, no staging left behind"


def test_a_verified_revision_is_reused_without_reading_the_source(weights: Path, tmp_path: Path) -> None:
    model = file_model(weights, compute_digest(weights))
    dest = tmp_path / "cache" / "rev1" / "tiny-model"
    prepull(model, dest)
    for f in weights.rglob("*"):
        if f.is_file():
            f.write_bytes(b"changed at the source")
    again = prepull(model, dest)
    assert again.reused and again.digest == model.digest


def test_same_weights_under_another_revision_are_hard_linked(weights: Path, tmp_path: Path) -> None:
    model = file_model(weights, compute_digest(weights))
    first = prepull(model, tmp_path / "cache" / "rev1" / "tiny-model")
    second = prepull(model, tmp_path / "cache" / "rev2" / "tiny-model")  # same pin, other engine args
    assert second.reused and second.digest == model.digest
    a, b = first.path / "config.json", second.path / "config.json"
    assert os.stat(a).st_ino == os.stat(b).st_ino


def test_pvc_source_is_read_from_the_mounted_claim(weights: Path, tmp_path: Path) -> None:
    # mounted as the Job mounts it: claim "src" at <root>/src
    model = ModelSource(source="pvc://src/tiny-model", digest=compute_digest(weights))
    pulled = prepull(model, tmp_path / "cache" / "rev1" / "tiny-model", source_root=tmp_path)
    assert pulled.digest == model.digest
    missing = ModelSource(source="pvc://src/nope", digest=compute_digest(weights))
    with pytest.raises(WeightsError, match="does not exist"):
        prepull(missing, tmp_path / "cache" / "rev2" / "nope", source_root=tmp_path)


def fake_hub(files: dict[str, bytes], calls: list[dict[str, Any]]):
    def snapshot_download(**kwargs: Any) -> str:
        calls.append(kwargs)
        root = Path(kwargs["local_dir"])
        (root / ".cache" / "huggingface").mkdir(parents=True)  # as the real one does
        for name, data in files.items():
            (root / name).write_bytes(data)
        return str(root)

    return snapshot_download


def test_hf_source_downloads_exactly_the_pinned_commit_and_records_its_digest(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    files = {"config.json": b"{}", "model.safetensors": b"weights"}
    model = ModelSource(source="hf://Org/Tiny", revision=SHA)
    pulled = prepull(model, tmp_path / "rev1" / "Tiny", token="secret", downloader=fake_hub(files, calls))
    assert [(c["repo_id"], c["revision"], c["token"]) for c in calls] == [("Org/Tiny", SHA, "secret")]
    record = read_record(pulled.path)
    assert record is not None and record["revision"] == SHA
    assert record["digest"] == pulled.digest == compute_digest(pulled.path)
    assert prepull(model, pulled.path, downloader=fake_hub(files, calls)).reused and len(calls) == 1
    # with a pinned digest that the commit does not have, it is refused
    pinned = ModelSource(source="hf://Org/Tiny", revision=SHA, digest="sha256:" + "1" * 64)
    with pytest.raises(WeightsError, match="digest mismatch"):
        prepull(pinned, tmp_path / "rev2" / "Tiny", downloader=fake_hub(files, calls))


def test_hf_refuses_anything_but_a_commit_sha(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="40-character"):
        ModelSource(source="hf://Org/Tiny", revision="main")
    unpinned = ModelSource.model_construct(source="hf://Org/Tiny", revision="main", digest=None)
    with pytest.raises(WeightsError, match="full commit SHA"):
        prepull(unpinned, tmp_path / "rev" / "Tiny", downloader=fake_hub({}, []))


def test_entry_point_reports_through_exit_code_and_termination_message(weights: Path, tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    log.touch()
    digest = compute_digest(weights)
    dest = str(tmp_path / "rev" / "tiny-model")
    base = ["--source", f"file://{weights}", "--dest", dest, "--termination-log", str(log)]
    assert main([*base, "--digest", "sha256:" + "2" * 64, "--quiet"]) == 1
    assert log.read_text().startswith("digest mismatch")
    assert main([*base, "--digest", "not-a-digest", "--quiet"]) == 2
    assert "malformed --digest" in log.read_text()
    proc = subprocess.run(
        [sys.executable, "-m", "folio.operator.prepull", *base, "--digest", digest],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert log.read_text() == digest
    assert "pulled and verified" in proc.stdout


def test_record_lives_beside_the_weights(weights: Path, tmp_path: Path) -> None:
    dest = tmp_path / "rev" / "tiny-model"
    prepull(file_model(weights, compute_digest(weights)), dest)
    assert (dest.parent / RECORD).is_file() and compute_digest(dest) == compute_digest(weights)
    # a record for another model name in the same folder does not count as this one
    assert read_record(dest.parent / "other-model") is None


def test_a_single_weights_file_is_pulled_as_a_file(tmp_path: Path) -> None:
    gguf = tmp_path / "src" / "model.Q4.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(os.urandom(10_000))
    model = file_model(gguf, compute_digest(gguf))
    assert model_dir_name(model) == "model.Q4.gguf"
    pulled = prepull(model, tmp_path / "cache" / "rev" / "model.Q4.gguf")
    assert pulled.path.is_file() and compute_digest(pulled.path) == model.digest


def test_parallel_settings_the_model_cannot_take_fail_the_pull_with_the_numbers(tiny_llama: Path, tmp_path: Path,
                                                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """The engine's own start-up checks, made by the pre-pull once the weights are verified: a revision whose
    engines could never start is reported (WeightsReady, failed) instead of failing each start. The verified
    copy stays for revisions that fit it."""
    model = file_model(tiny_llama, compute_digest(tiny_llama))  # 2 layers, 4 heads, 2 KV heads
    dest = tmp_path / "cache" / "rev1" / "model"
    with pytest.raises(WeightsError, match=r"pipeline_parallel_size 3 does not fit .* 2 decoder layers"):
        prepull(model, dest, parallel=(1, 3))
    assert read_record(dest) is not None, "verified all the same: another revision may use them"
    with pytest.raises(WeightsError, match=r"tensor_parallel_size 3 does not fit .* num_attention_heads 4"):
        prepull(model, dest, parallel=(3, 1))
    assert prepull(model, dest, parallel=(2, 2)).reused
    log = tmp_path / "termination-log"
    log.touch()
    code = main(["--source", model.source, "--digest", str(model.digest), "--dest", str(dest), "--quiet",
                 "--pipeline-parallel-size", "4", "--termination-log", str(log)])  # fmt: skip
    assert code == 1 and "pipeline_parallel_size 4 does not fit" in log.read_text()
    assert "spec.engine.args do not fit these weights" in capsys.readouterr().err


def test_a_draft_model_is_pulled_beside_the_weights_and_must_share_their_tokenizer(tiny_llama: Path,
                                                                                   tmp_path: Path) -> None:  # fmt: skip
    """`spec.draftModel`: the revision's Job fetches and verifies it into ``{rev}-draft`` after the weights,
    and refuses a draft of another vocabulary with the engine's own words (status shows them)."""
    from folio.operator.prepull import DraftPull, draft_weights_path
    from folio.operator.spec import DraftModelSpec
    from tests.support.models import make_tiny_llama

    model = file_model(tiny_llama, compute_digest(tiny_llama))
    draft = make_tiny_llama(tmp_path / "src" / "draft", num_hidden_layers=1, hidden_size=32, seed=3)
    other = make_tiny_llama(tmp_path / "src" / "other", vocab_size=384, num_hidden_layers=1)
    cache = tmp_path / "cache"
    pin = DraftModelSpec(source=f"file://{draft}", digest=compute_digest(draft))
    dest, draft_dest = cache / "rev1" / "model", Path(draft_weights_path("rev1", pin, str(cache)))
    assert draft_dest == cache / "rev1-draft" / "draft"
    prepull(model, dest, draft=DraftPull(pin, draft_dest))
    assert compute_digest(draft_dest) == pin.digest and read_record(draft_dest) is not None

    refused = DraftModelSpec(source=f"file://{other}", digest=compute_digest(other))
    with pytest.raises(WeightsError, match=r"the draft model file://.*other has another vocabulary .*\(384 tokens vs"):
        prepull(model, cache / "rev2" / "model", draft=DraftPull(refused, cache / "rev2-draft" / "other"))
    short = make_tiny_llama(tmp_path / "src" / "short", num_hidden_layers=1, max_position_embeddings=64)
    shorter = DraftModelSpec(source=f"file://{short}", digest=compute_digest(short))
    with pytest.raises(WeightsError, match=r"reads at most 64 positions .* fewer than the revision's max_model_len 1024"):
        prepull(model, cache / "rev5" / "model", draft=DraftPull(shorter, cache / "rev5-draft" / "short"))
    prepull(model, cache / "rev5" / "model", draft=DraftPull(shorter, cache / "rev5-draft" / "short", max_model_len=64))
    wrong = DraftModelSpec(source=f"file://{draft}", digest="sha256:" + "0" * 64)
    with pytest.raises(WeightsError, match="the draft model: digest mismatch"):
        prepull(model, cache / "rev3" / "model", draft=DraftPull(wrong, cache / "rev3-draft" / "draft"))
    assert not (cache / "rev3-draft" / "draft").exists(), "a draft that fails verification is never in place"

    log = tmp_path / "termination-log"
    log.touch()
    base = ["--source", model.source, "--digest", str(model.digest), "--dest", str(cache / "rev4" / "model"),
            "--termination-log", str(log), "--quiet"]  # fmt: skip
    assert main([*base, "--draft-source", refused.source, "--draft-digest", str(refused.digest),
                 "--draft-dest", str(cache / "rev4-draft" / "other")]) == 1  # fmt: skip
    assert "another vocabulary" in log.read_text()
    assert main([*base, "--draft-source", pin.source]) == 2 and "go together" in log.read_text()
    assert main([*base, "--draft-source", pin.source, "--draft-digest", str(pin.digest),
                 "--draft-dest", str(cache / "rev4-draft" / "draft")]) == 0  # fmt: skip
    assert log.read_text() == model.digest  # the model's digest, as without a draft
