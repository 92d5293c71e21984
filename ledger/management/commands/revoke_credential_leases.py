from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger import admin_selectors
from ledger.chain import format_time
from ledger.errors import DomainError
from ledger.management.commands.create_credential import tenant_by_slug
from ledger.models import CredentialLease, Tenant
from ledger.services.authority import credential_leases


class Command(BaseCommand):
    help = (
        "Revoke credential leases: one by id, or every active lease of a principal or whose id starts "
        "with a prefix (at least 4 hex digits). Prints each lease it revoked, or with --dry-run would "
        "revoke. Each revocation is a CREDENTIAL_LEASE_REVOKED event in the lease's run, naming the "
        "user and reason. Revoking a revoked lease changes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug")
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--lease", help="one lease id")
        which.add_argument("--principal", help="every active lease of this principal")
        which.add_argument("--prefix", help="every active lease whose id starts with these hex digits")
        parser.add_argument("--by", required=True, help="username of the person revoking")
        parser.add_argument("--reason", required=True, help="why (recorded in each affected run's chain)")
        parser.add_argument("--dry-run", action="store_true", help="only print what would be revoked")

    def handle(
        self,
        *args: object,
        tenant: str,
        lease: str | None,
        principal: str | None,
        prefix: str | None,
        by: str,
        reason: str,
        dry_run: bool,
        **options: object,
    ) -> None:
        tenant_obj = tenant_by_slug(tenant)
        try:
            if dry_run:
                leases = self.preview(tenant_obj, lease=lease, principal=principal, prefix=prefix)
            elif lease is not None:
                one = credential_leases.credential_lease_revoke(
                    tenant=tenant_obj, lease_id=lease, revoked_by=by, reason=reason
                )
                leases = [one.lease] if one.revoked_now else []
            else:
                leases = credential_leases.credential_leases_revoke(
                    tenant=tenant_obj, principal=principal, prefix=prefix, revoked_by=by, reason=reason
                )
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        for item in leases:
            self.stdout.write(
                f"{item.pk} principal={item.credential.principal} version={item.version} run={item.run_id} "
                f"expires_at={format_time(item.expires_at)}"
            )
        verb = "would revoke" if dry_run else "revoked"
        self.stdout.write(f"{verb} {len(leases)} lease(s) in tenant {tenant_obj.slug}{' (dry run)' if dry_run else ''}")

    @staticmethod
    def preview(
        tenant: Tenant, *, lease: str | None, principal: str | None, prefix: str | None
    ) -> list[CredentialLease]:
        if lease is None:
            return list(admin_selectors.credential_leases_matching(tenant=tenant, principal=principal, prefix=prefix))
        one = admin_selectors.credential_lease_get(tenant=tenant, lease_id=lease)
        return [] if one.revoked_at is not None else [one]
