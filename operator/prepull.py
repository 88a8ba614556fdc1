"""Weights pre-pull: fetch a revision's pinned weights into the cache and verify them before any pod serves.

In a cluster the operator runs one Job per revision, ``{isvc}-prepull-{rev}``, with the cache PVC
``{isvc}-weights`` mounted at ``/weights``; the Job runs

    python -m folio.operator.prepull --source SRC [--revision SHA] [--digest sha256:…] --dest /weights/REV/<model>

(``<model>`` is `model_dir_name`: the source's last path component), where the engine pods mount
them read-only; with a draft model (``spec.draftModel``, speculative decoding), ``--draft-source …
--draft-dest /weights/REV-draft/<model>`` too, checked to share the model's tokenizer. What happens per
scheme:

- ``hf://ORG/NAME``: downloaded with huggingface_hub at exactly the pinned 40-hex commit; the digest
  is computed and recorded (and must equal ``digest`` when one is pinned).
- ``pvc://CLAIM/PATH``: the claim is mounted read-only at ``/source/CLAIM`` (``--source-root``
  changes ``/source``); PATH is copied and the copy is verified against ``digest``.
- ``file:///PATH``: like pvc://, from a local path.
- ``pkg://DISTRIBUTION/PATH``: like file://, from a file an installed Python package ships
  (`folio.engine.package_files`; `folio up` only).

Work happens in a hidden staging folder and is moved into place only once verified, so a
half-written or mismatching copy is never visible at ``--dest``. A verified revision leaves a
record (`RECORD`) beside it; running again for the same pin is a no-op, and a revision with the same pinned
weights as another one in the cache (different engine args) hard-links that copy instead of
fetching it again. On success the Job's termination message is the digest; on failure it is the
reason, which the operator shows in ``WeightsReady``.

The Job and the cache PVC are planned by `folio.operator.serving.cache`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from folio.engine.digest import DigestMismatchError, compute_digest, verify_digest
from folio.engine.package_files import PackageFileError, package_file
from folio.operator.spec import COMMIT_RE, DIGEST_RE, DraftModelSpec, ModelSource, PinnedSource

RECORD = ".folio-weights.json"
CACHE_MOUNT = "/weights"
SOURCE_MOUNT = "/source"
TERMINATION_LOG = "/dev/termination-log"
DRAFT_TOKEN_ENV = "FOLIO_DRAFT_HF_TOKEN"  # the draft model's hub token (HF_TOKEN is the model's)

# progress(stage, bytes_done, bytes_total); stage is "download", "copy" or "verify"
Progress = Callable[[str, int, int], None]
# huggingface_hub.snapshot_download's shape (tests pass a fake: there is no hub to reach)
Downloader = Callable[..., Any]


class WeightsError(RuntimeError):
    """The weights cannot be made ready; the message says why and is shown in status."""


@dataclass(frozen=True)
class Pulled:
    path: Path  # what the engine serves
    digest: str
    reused: bool  # True when nothing was fetched (already there, or linked from another revision)


# ------------------------------------------------------------------------ naming


def model_dir_name(model: PinnedSource) -> str:
    """The last path component of the source: the file or folder name under ``/weights/{rev}``."""
    name = model.source.split("://", 1)[1].rstrip("/").rsplit("/", 1)[-1]
    if not name or name in (".", ".."):
        raise WeightsError(f"cannot name the weights of {model.source!r}: it has no final path component")
    return name


def weights_path(rev: str, model: PinnedSource, root: str = CACHE_MOUNT) -> str:
    """Where a revision's verified weights live in the cache: ``{root}/{rev}/<model>``.

    ``root`` is the cache: the volume mounted at ``/weights`` in a cluster, the state folder's
    ``cache/`` for `folio up`. Revisions with the same pinned weights share them (hard links).
    """
    return f"{root.rstrip('/')}/{rev}/{model_dir_name(model)}"


def pvc_claim_and_path(source: str) -> tuple[str, str]:
    """``pvc://CLAIM/PATH`` → (CLAIM, PATH)."""
    rest = source.removeprefix("pvc://")
    claim, _, path = rest.partition("/")
    if not claim or not path.strip("/"):
        raise WeightsError(f"pvc:// sources look like pvc://CLAIM/PATH/IN/CLAIM, got {source!r}")
    return claim, path.strip("/")


def local_source(model: PinnedSource, source_root: Path | None) -> Path:
    """Where a pvc://, file:// or pkg:// source is readable from this process."""
    if model.scheme == "pkg":
        try:
            return package_file(model.source)
        except PackageFileError as exc:
            raise WeightsError(str(exc)) from None
    if model.scheme == "file":
        parsed = urlparse(model.source)
        if parsed.netloc not in ("", "localhost"):
            raise WeightsError(f"file:// sources must be absolute local paths, got {model.source!r}")
        return Path(unquote(parsed.path))
    if model.scheme == "pvc":
        claim, path = pvc_claim_and_path(model.source)
        return (source_root or Path(SOURCE_MOUNT)) / claim / path
    raise WeightsError(f"{model.scheme}:// is not a local source")


# ------------------------------------------------------------------------- pulling


def read_record(dest: Path) -> dict[str, Any] | None:
    """The record of the verified weights at ``dest`` (kept in the revision folder, ``dest.parent``)."""
    try:
        record = json.loads((dest.parent / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("model") == dest.name else None


def _pin(model: PinnedSource) -> dict[str, Any]:
    return {"source": model.source, "revision": model.revision, "digest": model.digest}


def _matches(record: dict[str, Any] | None, model: PinnedSource) -> bool:
    if record is None:
        return False
    same = record.get("source") == model.source and record.get("revision") == model.revision
    return same and (model.digest is None or record.get("digest") == model.digest)


def prepull(
    model: ModelSource,
    dest: Path,
    *,
    source_root: Path | None = None,
    token: str | None = None,
    downloader: Downloader | None = None,
    progress: Progress | None = None,
    parallel: tuple[int, int] = (1, 1),
    draft: DraftPull | None = None,
) -> Pulled:
    """Make ``dest`` hold the verified pinned weights of ``model``; raise `WeightsError` if not, or if the
    model does not split over ``parallel`` (the revision's tensorParallelSize, pipelineParallelSize): its
    engines would refuse to start, every time. With ``draft`` (the revision's `spec.draftModel`), its
    weights too, checked to share the model's tokenizer.

    ``dest`` is the path the engine serves, ``/weights/{rev}/<model>`` in the cluster.
    """
    pulled = _pull(model, dest, source_root, token, downloader, progress)
    check_parallel(pulled.path, *parallel)
    if draft is not None:
        try:
            drafted = _pull(draft.pin, draft.dest, source_root, draft.token, downloader, progress)
        except WeightsError as exc:
            raise WeightsError(f"the draft model: {exc}") from None
        check_draft(pulled.path, drafted.path, draft.pin.source, draft.max_model_len)
    return pulled


@dataclass(frozen=True)
class DraftPull:
    """A revision's draft model: its pin, where it goes (`draft_weights_path`), the hub token for it, and the
    revision's maxModelLen (None: the model's own), which the draft must read as far as."""

    pin: PinnedSource
    dest: Path
    token: str | None = None
    max_model_len: int | None = None


def draft_weights_path(rev: str, pin: PinnedSource, root: str = CACHE_MOUNT) -> str:
    """Where a revision's draft model lives in the cache: ``{root}/{rev}-draft/<model>`` (a folder of its
    own, so that revisions with the same draft share it as they share weights)."""
    return weights_path(f"{rev}-draft", pin, root)


def check_draft(model: Path, draft: Path, source: str, max_model_len: int | None = None) -> None:
    """Raise `WeightsError` unless the draft at ``draft`` shares the tokenizer of the model at ``model`` and
    reads as many positions as the revision's engines serve (``max_model_len``, else the model's own): the
    engine's own start-up checks, made here so that status says so instead of every replica failing."""
    from folio.engine.loader import load_model_config
    from folio.engine.spec_decode.draft_model import DraftModelError, check_vocabulary
    from folio.engine.tokenizer.loading import load_tokenizer

    try:
        check_vocabulary(load_tokenizer(str(draft)), load_tokenizer(str(model)), f"the draft model {source}")
        needed = max_model_len or load_model_config(model)[0].max_position_embeddings
        reads = load_model_config(draft)[0].max_position_embeddings
    except DraftModelError as exc:
        raise WeightsError(str(exc)) from None
    except Exception as exc:  # a tokenizer or config that does not load: its libraries raise many types
        raise WeightsError(f"the draft model {source} cannot be read beside the model: {exc}") from exc
    if reads < needed:
        raise WeightsError(f"the draft model {source} reads at most {reads} positions (max_position_embeddings), "
                           f"fewer than the revision's max_model_len {needed}: lower spec.engine.args.maxModelLen "
                           "or pin another draft")  # fmt: skip


def check_parallel(path: Path, tensor: int, pipeline: int) -> None:
    """Raise `WeightsError` when the model at ``path`` cannot be sharded over ``tensor`` ranks (its heads,
    feed-forward sizes) or split into ``pipeline`` stages (its layers): the engine's own start-up checks,
    made once the weights are here so that status says so instead of a replica failing each start."""
    if (tensor, pipeline) == (1, 1):
        return
    from folio.engine.distributed.pipeline import check_pipelinable
    from folio.engine.distributed.sharding import check_shardable
    from folio.engine.loader import load_model_config

    cfg, _ = load_model_config(path)
    try:
        if tensor > 1:
            check_shardable(cfg, tensor)
        check_pipelinable(cfg, pipeline)
    except ValueError as exc:
        raise WeightsError(f"spec.engine.args do not fit these weights: {exc}") from None


def _pull(
    model: PinnedSource, dest: Path, source_root: Path | None, token: str | None, downloader: Downloader | None,
    progress: Progress | None,
) -> Pulled:
    final, folder = dest, dest.parent
    record = read_record(dest)
    if record is not None and _matches(record, model) and final.exists():
        return Pulled(final, str(record["digest"]), reused=True)
    if model.scheme == "hf" and not (model.revision and COMMIT_RE.match(model.revision)):
        raise WeightsError(f"hf:// weights are pulled only by full commit SHA, got revision {model.revision!r}")

    folder.mkdir(parents=True, exist_ok=True)
    staging = folder / f".staging-{final.name}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        work = staging / final.name
        reused = _link_sibling(model, final, work)
        if not reused:
            _fetch(model, work, source_root, token, downloader, progress)
        digest = _verify(model, work, progress)
        (folder / RECORD).unlink(missing_ok=True)  # an older pin's record must not outlive its weights
        if final.exists():
            shutil.rmtree(final) if final.is_dir() else final.unlink()
        work.rename(final)
        record = {**_pin(model), "digest": digest, "model": final.name}
        (folder / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Pulled(final, digest, reused)


def _link_sibling(model: PinnedSource, final: Path, target: Path) -> bool:
    """Hard-link the same pinned weights from another revision folder of the cache; True when done."""
    for record_file in sorted(final.parent.parent.glob(f"*/{RECORD}")):
        src = record_file.parent / final.name
        if record_file.parent == final.parent or not src.exists() or not _matches(read_record(src), model):
            continue
        try:
            _copy(src, target, link=True)
        except OSError:  # another filesystem, or links not allowed: fetch instead
            shutil.rmtree(target.parent, ignore_errors=True)
            return False
        return True
    return False


def _fetch(
    model: PinnedSource,
    target: Path,
    source_root: Path | None,
    token: str | None,
    downloader: Downloader | None,
    progress: Progress | None,
) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if model.scheme == "hf":
        if downloader is None:
            from huggingface_hub import snapshot_download as downloader  # heavy; only the Job needs it
        repo = model.source.removeprefix("hf://").strip("/")
        try:
            downloader(repo_id=repo, revision=model.revision, local_dir=str(target), token=token)
        except Exception as exc:  # the hub raises many types; all mean "could not fetch"
            raise WeightsError(f"download of {repo}@{model.revision} failed: {exc}") from exc
        return
    src = local_source(model, source_root)
    if not src.exists():
        raise WeightsError(f"weights not found: {src} does not exist ({model.source})")
    _copy(src, target, link=False, progress=progress)


def _verify(model: PinnedSource, path: Path, progress: Progress | None) -> str:
    on_bytes = (lambda done, total: progress("verify", done, total)) if progress else None
    if model.digest is None:  # hf:// without a pinned digest: record what the commit holds
        return compute_digest(path, on_bytes)
    try:
        return verify_digest(path, model.digest, on_bytes)
    except DigestMismatchError as exc:  # name the source, not the staging folder it was checked in
        raise WeightsError(f"digest mismatch: {str(exc).replace(str(path), model.source)}") from None


def _copy(src: Path, target: Path, *, link: bool, progress: Progress | None = None) -> None:
    """Copy (or hard-link) a file or a folder tree, skipping hidden entries like the digest does."""
    files = [src] if src.is_file() else [
        p for p in sorted(src.rglob("*"))
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(src).parts)
    ]
    total, done = sum(f.stat().st_size for f in files), 0
    for f in files:
        out = target if src.is_file() else target / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        if link:
            os.link(f, out)
        else:
            shutil.copyfile(f, out)
        done += f.stat().st_size
        if progress is not None:
            progress("copy", done, total)


# --------------------------------------------------------------------- entry point


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m folio.operator.prepull",
        description="Fetch a revision's pinned weights into DEST/<model> and verify them.",
    )
    p.add_argument("--source", required=True, help="hf://ORG/NAME, pvc://CLAIM/PATH, file:///PATH or pkg://DIST/PATH")
    p.add_argument("--revision", help="hf:// only: the full 40-hex commit SHA")
    p.add_argument("--digest", help="sha256:… the weights must have (required for pvc://, file:// and pkg://)")
    p.add_argument("--dest", required=True, type=Path, help="where the weights go: /weights/REV/<model>")
    p.add_argument("--source-root", type=Path, default=None, help="where pvc:// claims are mounted (/source)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="check that the model shards over this many ranks")
    p.add_argument("--pipeline-parallel-size", type=int, default=1, help="check that the model splits into this many stages")
    p.add_argument("--draft-source", help="the revision's draft model (spec.draftModel): its source, as --source")
    p.add_argument("--draft-revision", help="the draft's --revision")
    p.add_argument("--draft-digest", help="the draft's --digest")
    p.add_argument("--draft-dest", type=Path, help="where the draft goes: /weights/REV-draft/<model>")
    p.add_argument("--max-model-len", type=int, help="the revision's maxModelLen, which the draft must read to")
    p.add_argument("--termination-log", type=Path, default=Path(TERMINATION_LOG), help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.digest is not None and not DIGEST_RE.match(args.digest):
            raise WeightsError(f"malformed --digest {args.digest!r}: expected sha256: and 64 lowercase hex")
        model = ModelSource(source=args.source, revision=args.revision, digest=args.digest)
        draft = None
        if (args.draft_source is None) != (args.draft_dest is None):
            raise WeightsError("--draft-source and --draft-dest go together")
        if args.draft_source is not None:
            if args.draft_digest is not None and not DIGEST_RE.match(args.draft_digest):
                raise WeightsError(f"malformed --draft-digest {args.draft_digest!r}: expected sha256: and 64 lowercase hex")
            pin = DraftModelSpec(source=args.draft_source, revision=args.draft_revision, digest=args.draft_digest)
            draft = DraftPull(pin, args.draft_dest, os.environ.get(DRAFT_TOKEN_ENV), args.max_model_len)
    except (ValueError, WeightsError) as exc:
        return _finish(args, 2, f"invalid pin: {exc}")
    try:
        with ProgressBar(args.quiet) as progress:
            pulled = prepull(
                model, args.dest, source_root=args.source_root, token=os.environ.get("HF_TOKEN"),
                progress=progress, parallel=(args.tensor_parallel_size, args.pipeline_parallel_size), draft=draft,
            )
    except (WeightsError, OSError, ValueError) as exc:
        return _finish(args, 1, str(exc))
    how = "already in the cache" if pulled.reused else "pulled and verified"
    print(f"{pulled.path}: {how}, {pulled.digest}")
    return _finish(args, 0, pulled.digest)


def _finish(args: argparse.Namespace, code: int, message: str) -> int:
    """Report on stdout/stderr and, inside a pod, as the termination message the operator reads."""
    if code:
        print(f"prepull: {message}", file=sys.stderr)
    log: Path = args.termination_log
    if log.exists():  # the kubelet creates it in every container; elsewhere it is absent
        with contextlib.suppress(OSError):  # not writable: stdout and stderr said it already
            log.write_text(message[:4000])  # the kubelet keeps at most 4 KiB
    return code


class ProgressBar:
    """A rich progress bar per stage (download/copy/verify), or nothing when quiet.

    `folio up` shows one on its own console (``transient``: gone once done), named after the revision.
    """

    def __init__(self, quiet: bool, *, console: Any = None, transient: bool = False, label: str = "") -> None:
        self.quiet, self.console, self.transient, self.label = quiet, console, transient, label
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> Progress | None:
        if self.quiet:
            return None
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        # the description (a stage and a revision) is shown as it is, never read as markup
        self.bar = Progress(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                            TransferSpeedColumn(), console=self.console, transient=self.transient)
        self.bar.start()
        return self._update

    def _update(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.bar.add_task(f"{stage} {self.label}".strip(), total=total)
        self.bar.update(self.tasks[stage], completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


if __name__ == "__main__":
    sys.exit(main())
