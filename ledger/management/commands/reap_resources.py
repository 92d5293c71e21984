from django.core.management.base import BaseCommand, CommandParser

from ledger.management.sweeps import add_processes_argument, prefix, run_sweep
from ledger.services.lifespan.reaper import ResourceReapResult, resources_reap


class Command(BaseCommand):
    help = (
        "Close what runs left behind: resources asked for release (or past their deadlines) go to the "
        "driver of their kind; RELEASED only once the driver confirms; failures back off and raise alerts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch-size", type=int, default=None, help="resources claimed per transaction")
        add_processes_argument(parser)

    def handle(self, *args: object, batch_size: int | None = None, processes: int = 1, **options: object) -> None:
        def sweep(index: int) -> ResourceReapResult:
            def progress(result: ResourceReapResult) -> None:
                self.stderr.write(
                    f"  {prefix(index, processes)}batch {result.batches}: {result.released} released, "
                    f"{result.failed} failed, {result.alerts} alerts so far"
                )

            return resources_reap(batch_size=batch_size, progress=progress)

        results = run_sweep(sweep, processes)

        def total(name: str) -> int:
            return sum(getattr(result, name) for result in results)

        seconds = max(result.seconds for result in results)
        self.stdout.write(
            f"{total('requested')} resources past a deadline asked for release; {total('released')} released, "
            f"{total('failed')} cleanup failures, {total('alerts')} alerts; "
            f"{total('instances_released')} instances released ({seconds:.1f} s)"
        )
