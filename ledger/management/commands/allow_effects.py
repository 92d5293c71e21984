"""`manage.py allow_effects --tenant T --by NAME --reason ...`: after a restore check, a
person lets the tenant's workers authorize and dispatch again."""

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.errors import DomainError
from ledger.services.upgrades.restore import effects_allow


class Command(BaseCommand):
    help = "Allow a tenant's workers to act again after a restore (a person's decision, with a reason)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True)
        parser.add_argument("--by", required=True, help="the person deciding")
        parser.add_argument("--reason", required=True)

    def handle(self, *args: object, tenant: str, by: str, reason: str, **options: object) -> None:
        try:
            found = effects_allow(tenant=tenant, name=by, reason=reason)
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(f"{found.slug}: effects allowed by {by}")
