"""Tenants: the unit of isolation. A new tenant starts on the starter policy."""

from django.db import transaction
from django.utils.text import slugify

from ledger.errors import InvalidInput
from ledger.models import Tenant
from ledger.services.authority.policy import policy_create_starter


def tenant_ensure(*, slug: str, name: str | None = None) -> tuple[Tenant, bool]:
    """The tenant with this slug, created on the starter policy when missing."""
    clean = slugify(slug)
    if not clean or clean != slug:
        raise InvalidInput("tenant must be a slug: lowercase letters, digits and dashes")
    with transaction.atomic():
        tenant, created = Tenant.objects.get_or_create(slug=clean, defaults={"name": name or clean})
        if created:
            policy_create_starter(tenant=tenant)
    return tenant, created
