from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from approvals.services.approvals import approvals_expire
from ledger.management.sweeps import add_processes_argument, prefix, run_sweep


class Command(BaseCommand):
    help = "Mark approval requests past their expiry EXPIRED (a timeout never approves anything)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=500)
        add_processes_argument(parser)

    def handle(self, *args: Any, batch_size: int, processes: int = 1, **options: Any) -> None:
        def sweep(index: int) -> int:
            def progress(expired: int, batches: int) -> None:
                self.stderr.write(f"  {prefix(index, processes)}batch {batches}: {expired} expired so far")

            return approvals_expire(batch_size=batch_size, progress=progress)

        expired = sum(run_sweep(sweep, processes))
        self.stdout.write(f"expired {expired} approval request(s)")
