from django.core.management.base import BaseCommand, CommandParser

from ledger.services.evidence.retention import Due, retention_apply


class Command(BaseCommand):
    help = (
        "Remove what the diagnostic plane kept past its tenant's retention for its class "
        "(docs/operations.md); the chains, which commit to the payloads' digests, keep verifying."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="only say what is due, remove nothing")
        parser.add_argument("--batch", type=int, default=None, help="payloads per transaction")

    def handle(self, *args: object, dry_run: bool = False, batch: int | None = None, **options: object) -> None:
        def show(due: Due, removed: int) -> None:
            self.stderr.write(f"\r  {due.tenant} {due.klass}: {removed:,}/{due.count:,} removed", ending="")
            self.stderr.flush()

        result = retention_apply(dry_run=dry_run, batch=batch, progress=None if dry_run else show)
        if result.due and not dry_run:
            self.stderr.write("")
        for due in result.due:
            verb = "due" if dry_run else "past retention"
            self.stdout.write(
                f"{due.tenant} {due.klass}: {due.count:,} {verb} (created before {due.cutoff:%Y-%m-%d %H:%M} UTC)"
            )
        if dry_run:
            self.stdout.write(f"dry run: {sum(d.count for d in result.due):,} items due, none removed")
        else:
            self.stdout.write(f"removed {result.removed:,} items by retention")
