from django.core.management.base import BaseCommand

from ledger.services.fence.leases import ReapResult, leases_reap


class Command(BaseCommand):
    help = "Sweep expired run leases: their DISPATCHED operations become UNKNOWN with a reconciliation case."

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=None, help="runs claimed per transaction")

    def handle(self, *args, batch_size=None, **options):
        def progress(result: ReapResult) -> None:
            self.stderr.write(
                f"  batch {result.batches}: {result.leases} leases, {result.operations} operations so far"
            )

        result = leases_reap(batch_size=batch_size, progress=progress)
        self.stdout.write(f"reaped {result.leases} expired leases; {result.operations} operations now UNKNOWN")
