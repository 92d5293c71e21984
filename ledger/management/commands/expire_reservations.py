from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from ledger.management.sweeps import add_processes_argument, prefix, run_sweep
from ledger.services.authority.reservations import ExpiryResult, reservations_expire


class Command(BaseCommand):
    help = (
        "Cost reservations past their TTL become UNKNOWN (still counted against their budgets) "
        "with a COST_UNKNOWN event each; the tenants' cost breakers are re-evaluated."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=500, help="reservations claimed per transaction")
        add_processes_argument(parser)

    def handle(self, *args: object, batch_size: int = 500, processes: int = 1, **options: object) -> None:
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")

        def sweep(index: int) -> int:
            def progress(result: ExpiryResult) -> None:
                self.stderr.write(
                    f"  {prefix(index, processes)}batch {result.batches}: {result.reservations} reservations UNKNOWN so far"
                )

            try:
                return reservations_expire(batch_size=batch_size, progress=progress)
            except DatabaseError as exc:
                raise CommandError(f"expiring reservations failed: {type(exc).__name__}") from exc

        expired = sum(run_sweep(sweep, processes))
        self.stdout.write(f"expired {expired} cost reservations; they are now UNKNOWN")
