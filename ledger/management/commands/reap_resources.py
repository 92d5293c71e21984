from django.core.management.base import BaseCommand

from ledger.services.lifespan.reaper import ResourceReapResult, resources_reap


class Command(BaseCommand):
    help = (
        "Close what runs left behind: resources asked for release (or past their deadlines) go to the "
        "driver of their kind; RELEASED only once the driver confirms; failures back off and raise alerts."
    )

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=int, default=None, help="resources claimed per transaction")

    def handle(self, *args, batch_size=None, **options):
        def progress(result: ResourceReapResult) -> None:
            self.stderr.write(
                f"  batch {result.batches}: {result.released} released, {result.failed} failed, "
                f"{result.alerts} alerts so far"
            )

        result = resources_reap(batch_size=batch_size, progress=progress)
        self.stdout.write(
            f"{result.requested} resources past a deadline asked for release; {result.released} released, "
            f"{result.failed} cleanup failures, {result.alerts} alerts; {result.instances_released} instances released "
            f"({result.seconds:.1f} s)"
        )
