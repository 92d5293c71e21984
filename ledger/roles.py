"""Roles per tenant, as django-guardian object permissions on the Tenant (superusers see all).

| action                                   | viewer | operator | approver | admin |
|------------------------------------------|--------|----------|----------|-------|
| view runs, events, indicators            | yes    | yes      | yes      | yes   |
| claim / resolve reconciliation cases     |        | yes      |          | yes   |
| approve / deny approval requests         |        |          | yes      | yes   |
| revoke / rotate credentials, policy      |        |          |          | yes   |
| drain / quarantine workers, grant roles  |        |          |          | yes   |
"""

from django.contrib.auth import get_user_model
from django.db import transaction
from guardian.shortcuts import assign_perm, get_objects_for_user, remove_perm

from ledger.models import Tenant
from ledger.services.errors import InvalidInput

VIEW = "ledger.view_tenant"
OPERATE = "ledger.operate_tenant"
APPROVE = "ledger.approve_tenant"
ADMINISTER = "ledger.administer_tenant"

ROLES: dict[str, tuple[str, ...]] = {
    "viewer": (VIEW,),
    "operator": (VIEW, OPERATE),
    "approver": (VIEW, APPROVE),
    "admin": (VIEW, OPERATE, APPROVE, ADMINISTER),
}


def tenants_for(user, perm: str = VIEW):
    """The tenants on which ``user`` holds ``perm`` (all of them for a superuser)."""
    if not user.is_authenticated:
        return Tenant.objects.none()
    if user.is_superuser:
        return Tenant.objects.all()
    return get_objects_for_user(user, perm, klass=Tenant, accept_global_perms=False)


def can(user, tenant: Tenant, perm: str) -> bool:
    return user.is_authenticated and (user.is_superuser or user.has_perm(perm, tenant))


@transaction.atomic
def role_grant(*, username: str, tenant: Tenant, role: str, password: str | None = None):
    """Give ``username`` (created when missing) exactly ``role`` on ``tenant``."""
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}")
    User = get_user_model()
    user, created = User.objects.get_or_create(username=username)
    if password:
        user.set_password(password)
        user.save(update_fields=["password"])
    elif created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    for perm in {p for perms in ROLES.values() for p in perms}:
        remove_perm(perm, user, tenant)
    for perm in ROLES[role]:
        assign_perm(perm, user, tenant)
    return user, created
