"""Backfills: batched, resumable, idempotent, one at a time.

A backfill walks its table by primary key, ``BACKFILL_BATCH`` rows per transaction. Each
batch's writes and the progress row (``Backfill``: the last key done and the counts) commit
together, so a runner killed at any moment resumes after the last committed batch and
never does a row twice; and each row's update is conditional on its version (a row already
moved is not moved again), so running the whole backfill twice is running it once.

The progress row is also the lock: a runner takes it with a conditional UPDATE (free, or
held by nobody past ``held_until``) and renews it with every batch; a second runner is
refused (409 UPGRADE_REFUSED, naming the holder). A pause is asked for by setting the row
to PAUSING (``backfill_pause``, or SIGINT/SIGTERM in the command): the runner finishes its
batch and leaves it PAUSED. Records whose representations disagree are not moved: each
becomes a StateConflict once its batch has committed.

A dry run reads the same batches without writing (no lock, no progress): what would move,
and what would conflict."""

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Model
from django.utils import timezone

from ledger.errors import UpgradeRefused
from ledger.models import Backfill
from ledger.services.upgrades.conflicts import conflicts_open
from ledger.services.upgrades.phases import phase
from ledger.services.upgrades.provider_ref import Batch, ProviderRefBackfill
from ledger.services.upgrades.registry import spec_for
from ledger.sql import upgrades as sql_upgrades
from ledger.states import BackfillState, UpgradePhase


@dataclass
class Progress:
    name: str
    state: str
    scanned: int
    changed: int
    conflicts: int
    total_estimate: int
    batches: int
    seconds: float
    dry_run: bool = False
    would_conflict: list[str] = field(default_factory=list)

    @property
    def fraction(self) -> float:
        return min(1.0, self.scanned / self.total_estimate) if self.total_estimate else 1.0

    @property
    def rate(self) -> float:
        return self.scanned / self.seconds if self.seconds > 0 else 0.0


def me() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def estimate(model: type[Model]) -> int:
    """How many rows the table holds: the planner's figure (no scan), or a count of a table
    never analyzed. Only the progress display uses it."""
    estimated = sql_upgrades.estimated_rows(model)
    return estimated if estimated is not None else model._default_manager.count()


def _take(name: str, *, restart: bool) -> Backfill:
    now = timezone.now()
    Backfill.objects.get_or_create(name=name)
    lock_s = settings.FENCELINE["BACKFILL_LOCK_S"]
    with transaction.atomic():
        row = Backfill.objects.select_for_update().get(name=name)
        free = not row.holder or row.held_until is None or row.held_until < now or row.holder == me()
        if not free:
            raise UpgradeRefused(
                f"the backfill {name} is running in {row.holder} (its lock lapses at {row.held_until:%H:%M:%S} UTC "
                "unless it keeps working); pause it first",
                holder=row.holder,
            )
        if row.state == BackfillState.DONE and not restart:
            return row
        values = {
            "state": BackfillState.RUNNING,
            "holder": me(),
            "held_until": now + timedelta(seconds=lock_s),
            "updated_at": now,
        }
        if restart or row.started_at is None or row.state == BackfillState.DONE:
            values.update(last_key="", scanned=0, changed=0, conflicts=0, batches=0, started_at=now, finished_at=None)
        Backfill.objects.filter(name=name).update(**values)
    return Backfill.objects.get(name=name)


def backfill_pause(name: str) -> Backfill:
    """Ask a running backfill to stop after its current batch (a stopped one is PAUSED)."""
    spec_for(name)
    Backfill.objects.get_or_create(name=name)
    with transaction.atomic():
        row = Backfill.objects.select_for_update().get(name=name)
        if row.state == BackfillState.RUNNING:
            lapsed = row.held_until is not None and row.held_until < timezone.now()
            row.state = BackfillState.PAUSED if lapsed else BackfillState.PAUSING
            Backfill.objects.filter(name=name).update(state=row.state, updated_at=timezone.now())
    return Backfill.objects.get(name=name)


def backfill_run(
    name: str,
    *,
    batch_size: int | None = None,
    dry_run: bool = False,
    restart: bool = False,
    stop_after: float | None = None,
    report: Callable[[Progress], None] | None = None,
    stop_requested: Callable[[], bool] | None = None,
) -> Progress:
    """Run backfill ``name`` from where it stopped until it is DONE, PAUSED (asked to, or
    ``stop_after``: a fraction of the estimate, for tests and staged runs) or it fails (the
    batch in flight rolls back; the progress before it stays)."""
    spec = spec_for(name)
    size = batch_size or settings.FENCELINE["BACKFILL_BATCH"]
    total = estimate(spec.model)
    started = timezone.now()
    if dry_run:
        return _dry_run(spec, size=size, total=total, report=report)
    if phase(name) != UpgradePhase.MIGRATE:
        raise UpgradeRefused(
            f"the backfill of {name} runs in MIGRATE (it is in {phase(name)}): "
            f"manage.py upgrade migrate {name} --reason ... first"
        )
    row = _take(name, restart=restart)
    progress = Progress(name, row.state, row.scanned, row.changed, row.conflicts, total, row.batches, 0.0)
    if row.state == BackfillState.DONE:
        return progress
    Backfill.objects.filter(name=name).update(total_estimate=total)
    state = BackfillState.RUNNING
    try:
        state = _batches(
            spec,
            after=row.last_key,
            size=size,
            progress=progress,
            started=started,
            stop_after=stop_after,
            report=report,
            stop_requested=stop_requested,
        )
    finally:
        _let_go(name, state=state, progress=progress, started=started)
    if report:
        report(progress)
    return progress


def _batches(
    spec: ProviderRefBackfill,
    *,
    after: str,
    size: int,
    progress: Progress,
    started: datetime,
    stop_after: float | None,
    report: Callable[[Progress], None] | None,
    stop_requested: Callable[[], bool] | None,
) -> BackfillState:
    """Batch after batch, past key ``after``, until none is left (DONE) or a pause is asked
    for (PAUSED); the conflicts a batch found are opened once it has committed."""
    name = spec.name
    last_key = after
    while True:
        if (stop_requested and stop_requested()) or (stop_after is not None and progress.fraction >= stop_after):
            return BackfillState.PAUSED
        done = _batch(spec, after=last_key, size=size, progress=progress)
        if done is None:
            return BackfillState.PAUSED
        if done.scanned == 0:
            return BackfillState.DONE
        last_key = done.last_key
        if done.conflicts:  # after the batch commits: opening one locks a run
            opened = conflicts_open(done.conflicts, found_by=f"backfill:{name}")
            progress.conflicts += opened
            Backfill.objects.filter(name=name).update(conflicts=progress.conflicts)
        progress.seconds = (timezone.now() - started).total_seconds()
        if report:
            report(progress)


def _batch(spec: ProviderRefBackfill, *, after: str, size: int, progress: Progress) -> Batch | None:
    """One batch and its progress (and the lock renewed), in one transaction, while this
    runner holds the lock; None when a pause was asked for (nothing done)."""
    name = spec.name
    with transaction.atomic():
        current = Backfill.objects.select_for_update().get(name=name)
        if current.holder != me():
            raise UpgradeRefused(f"the backfill {name} lock was taken by {current.holder}")
        if current.state == BackfillState.PAUSING:
            return None
        done = spec.batch(after=after, limit=size)
        now = timezone.now()
        if done.scanned:
            progress.scanned += done.scanned
            progress.changed += done.changed
            progress.batches += 1
            Backfill.objects.filter(name=name).update(
                last_key=done.last_key,
                scanned=progress.scanned,
                changed=progress.changed,
                batches=progress.batches,
                updated_at=now,
                held_until=now + timedelta(seconds=settings.FENCELINE["BACKFILL_LOCK_S"]),
            )
    return done


def _let_go(name: str, *, state: BackfillState, progress: Progress, started: datetime) -> None:
    """Give the lock back and leave the backfill in the state this run ended in."""
    now = timezone.now()
    final = state if state != BackfillState.RUNNING else BackfillState.PAUSED  # an error leaves it resumable
    Backfill.objects.filter(name=name, holder=me()).update(
        state=final,
        holder="",
        held_until=None,
        updated_at=now,
        finished_at=now if final == BackfillState.DONE else None,
    )
    progress.state = final
    progress.seconds = (now - started).total_seconds()


def _dry_run(
    spec: ProviderRefBackfill, *, size: int, total: int, report: Callable[[Progress], None] | None
) -> Progress:
    started = timezone.now()
    progress = Progress(spec.name, "DRY_RUN", 0, 0, 0, total, 0, 0.0, dry_run=True)
    last_key = ""
    while True:
        with transaction.atomic():
            done = spec.batch(after=last_key, limit=size, dry_run=True)
            transaction.set_rollback(True)  # a dry run leaves nothing behind, whatever it read
        if done.scanned == 0:
            break
        last_key = done.last_key
        progress.scanned += done.scanned
        progress.changed += done.changed
        progress.conflicts += len(done.conflicts)
        progress.would_conflict += [f"operation:{c[0]}" for c in done.conflicts][:20]
        progress.batches += 1
        progress.seconds = (timezone.now() - started).total_seconds()
        if report:
            report(progress)
    progress.state = "DRY_RUN"
    progress.seconds = (timezone.now() - started).total_seconds()
    return progress


def backfill_status(name: str) -> Backfill:
    spec_for(name)
    row, _ = Backfill.objects.get_or_create(name=name)
    return row
