from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.errors import DomainError
from ledger.management.commands.create_credential import tenant_by_slug
from ledger.services.authority.credentials import credential_rotate


class Command(BaseCommand):
    help = (
        "Rotate a credential after its secret was replaced: version + 1, so every lease of an older "
        "version is refused at authorize and dispatch (DENY_STALE_VERSION). Each run holding an active "
        "lease gets a CREDENTIAL_ROTATED event naming the user and reason."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--principal", required=True, help="the credential's principal")
        parser.add_argument("--by", required=True, help="username of the person rotating")
        parser.add_argument("--reason", required=True, help="why (recorded in each affected run's chain)")

    def handle(self, *args: object, tenant: str, principal: str, by: str, reason: str, **options: object) -> None:
        tenant_obj = tenant_by_slug(tenant)
        try:
            rotation = credential_rotate(tenant=tenant_obj, principal=principal, rotated_by=by, reason=reason)
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        credential, runs = rotation.credential, rotation.affected_run_ids
        self.stdout.write(
            f"rotated {credential.principal} in tenant {tenant_obj.slug} to version {credential.version}; "
            f"CREDENTIAL_ROTATED recorded in {len(runs)} run(s)"
        )
        for run_id in runs:
            self.stdout.write(f"  run {run_id}")
