"""Sealed checkpoints kept outside the database, and the rollback check against them.

The verifier's checkpoints (``ledger.models.Checkpoint``) live in the database with the
events they seal, so a restored backup takes both back together: the chain looks whole,
only shorter. With ``FENCELINE["EXTERNAL_CHECKPOINTS"]`` set (a directory the operator keeps
apart from the database and its backups), every checkpoint the verifier seals is also
recorded there (run, seq, head hash, sealed_at, with the checkpoint's MAC), and
``rollback_of`` / ``rollback_check`` compare the database with it: a run whose head is
behind the last checkpoint kept outside, whose event at that seq hashes differently (a
rewritten chain), or that the database no longer holds, is ROLLED_BACK at that seq.

``CheckpointStore`` is the interface; ``DirectoryCheckpointStore`` keeps one append-only
JSON-lines file per run, each write a whole new file (temp file, fsync, rename, fsync of the
directory), so a crash mid-write leaves the previous file intact and at most a stray temp
file, which readers ignore. Another place (an object store) is another implementation of
the same three methods, chosen in ``configured_store``."""

import fcntl
import json
import os
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from django.conf import settings

from ledger.models import Event, Run

SUFFIX = ".jsonl"
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
    """One ``<run id>.jsonl`` per run under ``root``, each line an ``ExternalCheckpoint``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, run_id: str) -> Path:
        return self.root / f"{uuid.UUID(run_id)}{SUFFIX}"  # a run id, never a path

    def _read(self, run_id: str) -> list[ExternalCheckpoint]:
        try:
            text = self._path(run_id).read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [ExternalCheckpoint(**json.loads(line)) for line in text.splitlines() if line]

    def record(self, checkpoints: Sequence[ExternalCheckpoint]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        by_run: dict[str, list[ExternalCheckpoint]] = {}
        for checkpoint in checkpoints:
            by_run.setdefault(checkpoint.run_id, []).append(checkpoint)
        with open(self.root / ".lock", "a") as lock:  # one writer at a time (verifiers run in parallel)
            fcntl.flock(lock, fcntl.LOCK_EX)
            for run_id, new in by_run.items():
                kept = self._read(run_id)
                top = kept[-1].seq if kept else 0
                added = sorted((c for c in new if c.seq > top), key=lambda c: c.seq)
                if added:
                    self._replace(self._path(run_id), [*kept, *added])
            self._sync_directory()

    def _replace(self, path: Path, entries: list[ExternalCheckpoint]) -> None:
        """Write the whole file anew beside it and rename it into place: readers see the old
        file or the new one, never a part."""
        text = "".join(json.dumps(asdict(e), sort_keys=True) + "\n" for e in entries)
        fd, temp = tempfile.mkstemp(dir=self.root, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise

    def _sync_directory(self) -> None:
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)  # the renames are durable
        finally:
            os.close(fd)

    def last(self, run_id: str) -> ExternalCheckpoint | None:
        kept = self._read(run_id)
        return kept[-1] if kept else None

    def runs(self) -> Iterator[str]:
        if not self.root.is_dir():
            return
        for path in sorted(self.root.glob(f"*{SUFFIX}")):
            name = path.name.removesuffix(SUFFIX)
            with suppress(ValueError):  # a run's file, not a temp file or another one
                yield str(uuid.UUID(name))


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
