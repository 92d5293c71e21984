from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.errors import InvalidInput
from ledger.models import Tenant
from ledger.roles import ROLES
from ledger.services.tenancy.roles import role_grant


class Command(BaseCommand):
    help = "Give a user one role on a tenant (creating the user when missing)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", required=True)
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--role", required=True, choices=sorted(ROLES))
        parser.add_argument("--password", help="set the user's password (new users get none otherwise)")

    def handle(
        self, *args: Any, user: str, tenant: str, role: str, password: str | None = None, **options: Any
    ) -> None:
        found = Tenant.objects.filter(slug=tenant).first()
        if found is None:
            raise CommandError(f"no such tenant: {tenant}")
        try:
            account, created = role_grant(username=user, tenant=found, role=role, password=password)
        except InvalidInput as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(f"{'created' if created else 'updated'} user {account.username}: {role} on {found.slug}")
