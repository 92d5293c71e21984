"""`manage.py retention [--dry-run]`: remove what the diagnostic plane kept past its
retention, then the flow-control rows of idle intent-named keys (also the beat job
apply-retention). `manage.py retention --tenant T --days
CLASS=N ... [--user-content yes|no] --by NAME --reason ...`: a person sets the tenant's
retention per class and whether it accepts user content."""

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from ledger.errors import DomainError
from ledger.services.authority.flow import flow_keys_prune
from ledger.services.evidence.retention import Due, retention_apply
from ledger.services.tenancy.tenants import tenant_planes_set


class Command(BaseCommand):
    help = (
        "Remove what the diagnostic plane kept past its tenant's retention for its class "
        "(docs/operations.md); the chains, which commit to the payloads' digests, keep verifying. "
        "With --tenant: set that tenant's retention and user-content opt-in instead."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="only say what is due, remove nothing")
        parser.add_argument("--batch", type=int, default=None, help="items per transaction")
        parser.add_argument("--tenant", help="set this tenant's retention (with --by and --reason)")
        parser.add_argument("--days", action="append", default=[], metavar="CLASS=N", help="days to keep CLASS")
        parser.add_argument("--user-content", choices=["yes", "no"], help="whether the tenant accepts user content")
        parser.add_argument("--by", help="the person deciding")
        parser.add_argument("--reason")

    def handle(self, *args: object, **options: object) -> None:
        if options["tenant"]:
            self._configure(options)
            return
        dry_run = bool(options["dry_run"])
        batch = options["batch"]

        def show(due: Due, removed: int) -> None:
            self.stderr.write(f"\r  {due.tenant} {due.klass}: {removed:,}/{due.count:,} removed", ending="")
            self.stderr.flush()

        result = retention_apply(
            dry_run=dry_run, batch=batch if isinstance(batch, int) else None, progress=None if dry_run else show
        )
        if result.due and not dry_run:
            self.stderr.write("")
        for due in result.due:
            verb = "due" if dry_run else "past retention"
            cutoff = f"{due.cutoff:%Y-%m-%d %H:%M} UTC"
            self.stdout.write(f"{due.tenant} {due.klass}: {due.count:,} {verb} (kept since before {cutoff})")
        if dry_run:
            self.stdout.write(f"dry run: {sum(d.count for d in result.due):,} items due, none removed")
        else:
            self.stdout.write(f"removed {result.removed:,} items by retention")
            pruned = flow_keys_prune(now=timezone.now(), batch=batch if isinstance(batch, int) else None)
            self.stdout.write(
                f"pruned {pruned.places:,} places and {pruned.shards:,} bucket shards of idle intent-named flow keys"
            )

    def _configure(self, options: dict[str, object]) -> None:
        if not options["by"] or not options["reason"]:
            raise CommandError("--tenant needs --by NAME and --reason")
        days: dict[str, object] = {}
        for item in options["days"] or []:  # type: ignore[attr-defined]
            klass, sep, count = str(item).partition("=")
            if not sep or not count.isdigit():
                raise CommandError(f"--days takes CLASS=N (whole days), not {item!r}")
            days[klass] = int(count)
        choice = options["user_content"]
        try:
            tenant = tenant_planes_set(
                tenant=str(options["tenant"]),
                days=days,
                user_content=None if choice is None else choice == "yes",
                reason=options["reason"],
                name=str(options["by"]),
            )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        opted = "accepts" if tenant.user_content_opt_in else "refuses"
        self.stdout.write(f"{tenant.slug}: retention {tenant.retention_days or 'defaults'}; {opted} user content")
