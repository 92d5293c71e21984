from django.core.management.base import BaseCommand, CommandError, CommandParser

from ledger.errors import ForbiddenField, InvalidInput
from ledger.services.fleet.workers import worker_create
from ledger.services.tenancy.tenants import tenant_ensure


class Command(BaseCommand):
    help = "Create a worker (and its tenant when missing). Prints the bearer token alone on the last line."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", required=True, help="tenant slug; created when missing")
        parser.add_argument("--name", required=True, help="worker name, unique in the tenant")

    def handle(self, *args: object, tenant: str, name: str, **options: object) -> None:
        try:
            tenant_obj, created = tenant_ensure(slug=tenant)
            worker, token = worker_create(tenant=tenant_obj, name=name)
        except (InvalidInput, ForbiddenField) as exc:
            raise CommandError(exc.detail) from None
        if created:
            self.stdout.write(f"created tenant {tenant_obj.slug}")
        self.stdout.write(f"created worker {worker.name} in tenant {tenant_obj.slug}; its bearer token (shown once):")
        self.stdout.write(token)
