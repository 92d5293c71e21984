"""`manage.py restore_check`: run on a restored database before any worker acts. Compares it
with its backup manifest and this build, verifies every run's chain, reports records at
mixed schema versions, and holds effects on every tenant (workers are admitted read-only)
until a person allows them (`manage.py allow_effects`). Then it advances the fence past the
restore (`ledger.services.fence.restore`): a new fence generation, every credential lease
alive revoked, every run lease held ended (its dispatched operations UNKNOWN with a case),
RUN_RESTORED in each of those runs' chains. With `--no-hold` it only checks. Exits 1 when a
problem must be fixed first."""

import sys

from django.core.management.base import BaseCommand, CommandParser

from ledger.services.fence.restore import FenceRestore, fence_restore
from ledger.services.upgrades.restore import restore_check


class Command(BaseCommand):
    help = "Check a restored database; hold effects on its tenants until a person allows them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--by", default="manage.py restore_check", help="who runs the check (recorded)")
        parser.add_argument("--tenant", action="append", dest="tenants", help="hold only these tenants (repeatable)")
        parser.add_argument(
            "--no-hold", action="store_true", help="check only; hold no tenant's effects and leave the fence as it is"
        )

    def handle(self, *args: object, by: str, tenants: list[str] | None, no_hold: bool, **options: object) -> None:
        tty = sys.stderr.isatty()

        def progress(done: int, total: int) -> None:
            line = f"verifying chains: {done:,}/{total:,} runs"
            self.stderr.write(("\r" + line) if tty else line, ending="" if tty else "\n")

        report = restore_check(by=by, tenants=tenants, hold=not no_hold, progress=progress)
        if tty:
            self.stderr.write("")
        fenced = None if no_hold or report.pending_migrations else fence_restore(by=by)
        if fenced is not None and fenced.problem:
            report.problems.append(fenced.problem)
        self.stdout.write(f"manifest: {report.manifest_taken_at or 'none'}")
        self.stdout.write(
            f"chains: {report.runs_verified:,} runs, {report.events_verified:,} events verified; "
            f"{len(report.broken_runs)} BROKEN"
        )
        for label, counts in report.mixed.items():
            self.stdout.write(f"mixed versions: {label} {counts}")
        for note in report.notes:
            self.stdout.write(f"note: {note}")
        for problem in report.problems:
            self.stdout.write(f"PROBLEM: {problem}")
        if fenced is not None:
            self._fence(fenced)
        if report.held_tenants:
            self.stdout.write(
                f"effects held for {', '.join(report.held_tenants)}: workers are admitted read-only until "
                "manage.py allow_effects --tenant T --by NAME --reason '...' (or the tenant's console page)"
            )
        self.stdout.write("restore check: " + ("OK" if report.ok else "PROBLEMS (fix them before allowing effects)"))
        if not report.ok:
            sys.exit(1)

    def _fence(self, fenced: FenceRestore) -> None:
        self.stdout.write(
            f"fence: generation {fenced.previous_generation} -> {fenced.generation}; "
            f"{fenced.leases_ended:,} run leases ended ({fenced.operations_unknown:,} dispatched operations UNKNOWN "
            f"with a case), {fenced.credential_leases_revoked:,} credential leases revoked, "
            f"RUN_RESTORED in {fenced.runs_recorded:,} runs' chains"
        )
