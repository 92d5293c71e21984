"""`manage.py backfill NAME`: run a schema change's backfill (docs/operations.md "Upgrades").

Resumes where it stopped; runs once however often it is started (a row already moved is not
moved again); one runner at a time (a second is refused, naming the first). Ctrl-C or
SIGTERM finishes the batch in flight and leaves it PAUSED; `--pause` asks a running one (in
another process) to do the same. `--dry-run` reads everything and writes nothing: what would
move and what would become a state conflict."""

import signal
import sys
from types import FrameType

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.errors import DomainError
from ledger.services.upgrades.backfill import Progress, backfill_pause, backfill_run, backfill_status
from ledger.services.upgrades.registry import BACKFILLS


class Command(BaseCommand):
    help = "Run, resume, pause or dry-run the backfill of a schema change (e.g. operation.provider_ref)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help=f"the schema change: {', '.join(sorted(BACKFILLS))}")
        parser.add_argument("--dry-run", action="store_true", help="write nothing: count what would move or conflict")
        parser.add_argument("--pause", action="store_true", help="ask the running backfill to stop after its batch")
        parser.add_argument("--status", action="store_true", help="show where it stands and exit")
        parser.add_argument("--restart", action="store_true", help="walk the table from the start again")
        parser.add_argument("--batch", type=int, default=None, help="rows per transaction (FENCELINE_BACKFILL_BATCH)")
        parser.add_argument("--stop-after", type=float, default=None, help="pause once this fraction is done (0..1)")

    def handle(
        self,
        *args: object,
        name: str,
        dry_run: bool,
        pause: bool,
        status: bool,
        restart: bool,
        batch: int | None,
        stop_after: float | None,
        **options: object,
    ) -> None:
        _check_arguments(name, batch=batch, stop_after=stop_after)
        if status:
            row = backfill_status(name)
            self.stdout.write(
                f"{name}: {row.state}, {row.scanned:,} rows looked at, {row.changed:,} moved, {row.conflicts} conflicts"
                f"{', held by ' + row.holder if row.holder else ''}"
            )
            return
        if pause:
            row = backfill_pause(name)
            self.stdout.write(f"{name}: {row.state}")
            return
        tty = sys.stderr.isatty()
        done = self._run(name, batch=batch, dry_run=dry_run, restart=restart, stop_after=stop_after, tty=tty)
        if tty:
            self.stderr.write("")
        verb = "would move" if dry_run else "moved"
        self.stdout.write(
            f"{name}: {done.state}; {done.scanned:,} rows looked at, {done.changed:,} {verb}, "
            f"{done.conflicts} state conflicts, {done.seconds:.1f} s ({done.rate:,.0f} rows/s)"
        )
        for record in done.would_conflict:
            self.stdout.write(f"  would conflict: {record}")
        if done.state == "PAUSED":
            self.stdout.write(f"resume with: manage.py backfill {name}")

    def _run(
        self, name: str, *, batch: int | None, dry_run: bool, restart: bool, stop_after: float | None, tty: bool
    ) -> Progress:
        """The backfill until it is done or paused; Ctrl-C or SIGTERM asks it to pause after
        the batch in flight (the previous handlers come back afterwards)."""
        stopping = {"asked": False}

        def stop(signum: int, frame: FrameType | None) -> None:
            stopping["asked"] = True
            self.stderr.write("\nstopping after this batch (it stays resumable) ...")

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return backfill_run(
                name,
                batch_size=batch,
                dry_run=dry_run,
                restart=restart,
                stop_after=stop_after,
                report=lambda progress: self._show(progress, tty=tty),
                stop_requested=lambda: stopping["asked"],
            )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _show(self, progress: Progress, *, tty: bool) -> None:
        """One progress line: rewritten in place on a terminal, one line per batch otherwise."""
        line = (
            f"{progress.name}: {progress.fraction:6.1%} {progress.scanned:,}/{progress.total_estimate:,} rows, "
            f"{progress.changed:,} {'would move' if progress.dry_run else 'moved'}, {progress.conflicts} conflicts, "
            f"{progress.rate:,.0f} rows/s"
        )
        if progress.rate and progress.total_estimate > progress.scanned:
            line += f", ~{(progress.total_estimate - progress.scanned) / progress.rate:,.0f} s left"
        self.stderr.write(("\r" + line) if tty else line, ending="" if tty else "\n")
        self.stderr.flush()


def _check_arguments(name: str, *, batch: int | None, stop_after: float | None) -> None:
    if name not in BACKFILLS:
        raise CommandError(f"no backfill {name!r}; known: {', '.join(sorted(BACKFILLS))}")
    if batch is not None and batch < 1:
        raise CommandError("--batch must be at least 1")
    if stop_after is not None and not 0 < stop_after <= 1:
        raise CommandError("--stop-after is a fraction in (0, 1]")
