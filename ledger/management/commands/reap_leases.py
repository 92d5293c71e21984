from django.core.management.base import BaseCommand, CommandParser

from ledger.management.sweeps import add_processes_argument, prefix, run_sweep
from ledger.services.fence.leases import ReapResult, leases_reap


class Command(BaseCommand):
    help = "Sweep expired run leases: their DISPATCHED operations become UNKNOWN with a reconciliation case."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=None, help="runs claimed per transaction")
        add_processes_argument(parser)

    def handle(self, *args: object, batch_size: int | None = None, processes: int = 1, **options: object) -> None:
        def sweep(index: int) -> ReapResult:
            def progress(result: ReapResult) -> None:
                self.stderr.write(
                    f"  {prefix(index, processes)}batch {result.batches}: {result.leases} leases, "
                    f"{result.operations} operations so far"
                )

            return leases_reap(batch_size=batch_size, progress=progress)

        results = run_sweep(sweep, processes)
        leases, operations = sum(r.leases for r in results), sum(r.operations for r in results)
        self.stdout.write(f"reaped {leases} expired leases; {operations} operations now UNKNOWN")
