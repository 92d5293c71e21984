"""Tenants: the unit of isolation. A new tenant starts on the starter policy."""

from typing import Any

from django.db import transaction
from django.utils.text import slugify

from ledger.errors import InvalidInput, NotFound
from ledger.models import Tenant
from ledger.roles import ADMINISTER
from ledger.services.authority.policy import policy_create_starter
from ledger.services.core.decisions import acting_name, admin_action_record, decision_reason
from ledger.services.evidence.planes import RETENTION_CLASSES

MAX_RETENTION_DAYS = 36_500


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


def tenant_planes_set(
    *,
    tenant: str,
    reason: object,
    days: dict[str, object] | None = None,
    user_content: bool | None = None,
    user: Any = None,
    name: str = "",
) -> Tenant:
    """Set the tenant's retention per class of the diagnostic plane (whole days, 0 to
    MAX_RETENTION_DAYS, over FENCELINE["RETENTION_DAYS"]) and, if given, whether it accepts
    user content; recorded as the admin action ``tenant.planes``. A console ``user`` needs
    the admin role on the tenant; a command names the person."""
    why = decision_reason(reason)
    days = days or {}
    for klass, value in days.items():
        if klass not in RETENTION_CLASSES:
            raise InvalidInput(f"retention class must be one of {', '.join(RETENTION_CLASSES)}", field="days")
        if type(value) is not int or not 0 <= value <= MAX_RETENTION_DAYS:
            raise InvalidInput(f"days of {klass} must be whole days, 0 to {MAX_RETENTION_DAYS}", field="days")
    found = Tenant.objects.filter(slug=tenant).first()
    if found is None:
        raise NotFound(f"there is no tenant {tenant!r}")
    by = acting_name(user=user, name=name, tenant_id=found.pk, perm=ADMINISTER)
    with transaction.atomic():
        found = Tenant.objects.select_for_update().get(pk=found.pk)
        found.retention_days = {**found.retention_days, **days}
        if user_content is not None:
            found.user_content_opt_in = user_content
        found.save(update_fields=["retention_days", "user_content_opt_in"])
        changed: dict[str, Any] = {"retention_days": days}
        if user_content is not None:
            changed["user_content_opt_in"] = user_content
        admin_action_record(
            tenant=found, actor=by, action="tenant.planes", subject=found.slug, reason=why, fields=changed
        )
    return found
