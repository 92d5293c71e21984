"""Tenant policy versions: the starter version at tenant creation, and changes by admins.
Every change is a new immutable version; decisions record the version they were made under."""

from typing import Any

from django.db import transaction
from django.db.models import F

from ledger.actors import SYSTEM, user_actor
from ledger.errors import InvalidInput
from ledger.models import Tenant, TenantPolicy
from ledger.policy import starter_policy, validate_policy
from ledger.roles import ADMINISTER
from ledger.services.core.decisions import acting_name, admin_action_record, decision_reason


def policy_create_starter(*, tenant: Tenant) -> TenantPolicy:
    return TenantPolicy.objects.create(
        tenant=tenant, version=1, document=starter_policy(), created_by=SYSTEM, reason="starter policy"
    )


def policy_current(*, tenant: Tenant) -> tuple[int, dict[str, Any]]:
    """(version, document) of the tenant's current policy, read fresh."""
    current = Tenant.objects.filter(pk=tenant.pk).values("policy_version")[:1]
    return TenantPolicy.objects.filter(tenant=tenant, version=current).values_list("version", "document").get()


@transaction.atomic
def policy_change(
    *, tenant: Tenant, document: dict[str, Any], reason: str, changed_by: str = "", user: Any = None
) -> TenantPolicy:
    """A new policy version, made current. Who made it and why are required; given a
    console ``user``, their admin role on the tenant is checked and they are named."""
    changed_by = acting_name(user=user, name=changed_by, tenant_id=tenant.pk, perm=ADMINISTER)
    if not changed_by:
        raise InvalidInput("a policy change names who made it and why")
    reason = decision_reason(reason)
    validated = validate_policy(document)
    locked = Tenant.objects.select_for_update().get(pk=tenant.pk)
    version = locked.policy_version + 1
    row = TenantPolicy.objects.create(
        tenant=locked, version=version, document=validated, created_by=changed_by, reason=reason
    )
    Tenant.objects.filter(pk=locked.pk).update(policy_version=F("policy_version") + 1)
    admin_action_record(
        tenant=locked,
        actor=user_actor(changed_by),
        action="policy.change",
        subject=f"version {version}",
        reason=reason,
        now=row.created_at,
    )
    tenant.policy_version = version
    return row
