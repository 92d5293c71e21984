"""Sealed checkpoints kept outside the database, and the rollback check against them.

The verifier's checkpoints (``ledger.models.Checkpoint``) live in the database with the
events they seal, so a restored backup takes both back together: the chain looks whole,
only shorter. With ``FENCELINE["EXTERNAL_CHECKPOINTS"]`` set (a directory the operator keeps
apart from the database and its backups), every checkpoint the verifier seals is also
recorded there (run, seq, head hash, sealed_at, with the checkpoint's MAC), and
``rollback_of`` / ``rollback_check`` compare the database with it: a run whose head is
behind the last checkpoint kept outside, whose event at that seq hashes differently (a
rewritten chain), or that the database no longer holds, is ROLLED_BACK at that seq.

``CheckpointStore`` is the interface; ``DirectoryCheckpointStore`` keeps one file per
checkpoint in a folder per run, each written whole beside its place (temp file, fsync, rename,
fsync of the folder) and never written again, so a crash mid-write leaves what was kept intact
and at most a stray temp file, which readers ignore. Another place (an object store, whose puts
are whole objects) is another implementation of the same three methods, chosen in ``configured_store``."""

import json
import os
import re
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from django.conf import settings

from ledger.models import Event, Run

SUFFIX = ".json"
ROLLED_BACK = "rolled_back"  # the verifier's finding reason (integrity BROKEN names it)


@dataclass(frozen=True)
class ExternalCheckpoint:
    """One sealed checkpoint as kept outside the database."""

    run_id: str
    seq: int
    last_hash: str
    sealed_at: str
    verifier_version: str
    key_id: str
    mac: str


class CheckpointStore(Protocol):
    """Where the verifier keeps its sealed checkpoints apart from the database: append only."""

    def record(self, checkpoints: Sequence[ExternalCheckpoint]) -> None:
        """Keep these checkpoints durably (a seq already kept for a run is kept as it was)."""

    def last(self, run_id: str) -> ExternalCheckpoint | None:
        """The highest checkpoint kept for ``run_id``, or None."""

    def runs(self) -> Iterator[str]:
        """The ids of the runs with a checkpoint kept."""


class DirectoryCheckpointStore:
    """``root/<run id>/<seq, 20 digits>.json`` per checkpoint, each an ``ExternalCheckpoint``:
    a file once renamed into place is never written again, so a seal costs the same however
    long the run, and concurrent verifiers need no lock (they seal the same content)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, run_id: str) -> Path:
        return self.root / str(uuid.UUID(run_id))  # a run id, never a path

    def record(self, checkpoints: Sequence[ExternalCheckpoint]) -> None:
        touched: set[Path] = set()
        for checkpoint in checkpoints:
            folder = self._dir(checkpoint.run_id)
            if not folder.is_dir():
                folder.mkdir(parents=True, exist_ok=True)
                touched.add(folder.parent)
            path = folder / f"{checkpoint.seq:020d}{SUFFIX}"
            if not path.exists():  # a seq already kept is kept as it was
                self._write(path, checkpoint)
                touched.add(folder)
        for folder in sorted(touched, key=lambda p: len(p.parts), reverse=True):
            _sync_directory(folder)  # the renames (and new run folders) are durable

    def _write(self, path: Path, checkpoint: ExternalCheckpoint) -> None:
        """Write the file beside its place and rename it there: readers see it whole or not
        at all; a crash leaves at most a ``.*.tmp`` file, which they ignore."""
        fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps(asdict(checkpoint), sort_keys=True) + "\n")
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def last(self, run_id: str) -> ExternalCheckpoint | None:
        try:
            names = [e.name for e in os.scandir(self._dir(run_id)) if _KEPT.fullmatch(e.name)]
        except FileNotFoundError:
            return None
        if not names:
            return None
        text = (self._dir(run_id) / max(names)).read_text(encoding="utf-8")
        return ExternalCheckpoint(**json.loads(text))

    def runs(self) -> Iterator[str]:
        if not self.root.is_dir():
            return
        for entry in sorted(os.scandir(self.root), key=lambda e: e.name):
            with suppress(ValueError):  # a run's folder, nothing else
                if entry.is_dir():
                    yield str(uuid.UUID(entry.name))


_KEPT = re.compile(r"[0-9]{20}" + re.escape(SUFFIX))


def _sync_directory(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def configured_store() -> CheckpointStore | None:
    """The store ``FENCELINE["EXTERNAL_CHECKPOINTS"]`` names (a directory), or None (unset)."""
    where = settings.FENCELINE.get("EXTERNAL_CHECKPOINTS") or ""
    return DirectoryCheckpointStore(Path(where)) if where else None


@dataclass(frozen=True)
class Rollback:
    """A run the database holds behind (or other than) its last checkpoint kept outside."""

    run_id: str
    seq: int  # the seq of that checkpoint
    first_seq: int  # the first seq the database lacks or holds differently
    detail: str


def rollback_of(run_id: str, *, store: CheckpointStore) -> Rollback | None:
    """``run_id`` against the last checkpoint ``store`` keeps for it: ROLLED_BACK when the
    database lacks the run, its head is behind that seq, or its event there hashes otherwise."""
    kept = store.last(run_id)
    if kept is None:
        return None
    where = f"the checkpoint kept outside the database at seq {kept.seq} (sealed {kept.sealed_at})"
    head = Run.objects.filter(pk=run_id).values_list("last_seq", flat=True).first()
    if head is None:
        return Rollback(run_id, kept.seq, 1, f"the database has no run {run_id}, yet {where} names it")
    if head < kept.seq:
        return Rollback(run_id, kept.seq, head + 1, f"the database's head seq {head} is behind {where}")
    found = Event.objects.filter(run_id=run_id, seq=kept.seq).values_list("hash", flat=True).first()
    if found != kept.last_hash:
        return Rollback(
            run_id, kept.seq, kept.seq, f"the event at seq {kept.seq} hashes otherwise than {where}: a rewritten chain"
        )
    return None


def rollback_check(*, store: CheckpointStore | None = None) -> list[Rollback]:
    """Every run the store keeps a checkpoint for, against the database (empty when no
    store is configured)."""
    store = store if store is not None else configured_store()
    if store is None:
        return []
    return [found for run_id in store.runs() if (found := rollback_of(run_id, store=store)) is not None]
