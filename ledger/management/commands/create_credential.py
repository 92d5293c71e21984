from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.errors import DomainError
from ledger.models import Tenant
from ledger.services.authority.credentials import credential_create


class Command(BaseCommand):
    help = (
        "Register a credential: a principal and a reference to where its secret is kept "
        "(e.g. vault:kv/github-bot). Never pass the secret itself; a secret-looking reference is refused."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--principal", required=True, help="principal name, unique in the tenant")
        parser.add_argument("--secret-ref", required=True, dest="secret_ref", help="'<scheme>:<location>' reference")

    def handle(self, *args: object, tenant: str, principal: str, secret_ref: str, **options: object) -> None:
        tenant_obj = tenant_by_slug(tenant)
        try:
            credential = credential_create(tenant=tenant_obj, principal=principal, secret_ref=secret_ref)
        except DomainError as exc:
            raise CommandError(exc.detail) from None
        self.stdout.write(
            f"created credential {credential.principal} version {credential.version} in tenant {tenant_obj.slug}"
            f" (secret kept at {credential.secret_ref})"
        )


def tenant_by_slug(slug: str) -> Tenant:
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        raise CommandError(f"no tenant {slug!r}")
    return tenant
