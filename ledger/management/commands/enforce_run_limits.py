from django.core.management.base import BaseCommand, CommandParser

from ledger.services.fence.ending import runs_enforce_limits


class Command(BaseCommand):
    help = (
        "Time out runs past their maximum runtime (through the cancellation path) and finish "
        "cancellations past their grace (what is still DISPATCHED becomes UNKNOWN with a case)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=None, help="runs claimed per transaction")

    def handle(self, *args: object, batch_size: int | None = None, **options: object) -> None:
        result = runs_enforce_limits(batch_size=batch_size)
        self.stdout.write(f"{result.timed_out} runs timed out; {result.finished} cancellations finished")
