"""Roles per tenant, as django-guardian object permissions on the Tenant (superusers see all).

| action                                   | viewer | operator | approver | admin |
|------------------------------------------|--------|----------|----------|-------|
| view runs, events, indicators            | yes    | yes      | yes      | yes   |
| read diagnostic payloads (data planes)   |        | yes      |          | yes   |
| claim / resolve reconciliation cases     |        | yes      |          | yes   |
| approve / deny approval requests         |        |          | yes      | yes   |
| revoke / rotate credentials, policy      |        |          |          | yes   |
| drain / quarantine workers, grant roles  |        |          |          | yes   |
"""

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import QuerySet
from guardian.shortcuts import get_objects_for_user

from ledger.models import Tenant

VIEW = "ledger.view_tenant"
OPERATE = "ledger.operate_tenant"
APPROVE = "ledger.approve_tenant"
ADMINISTER = "ledger.administer_tenant"
# The diagnostic plane (docs/architecture.md, Data planes): event payloads beyond the control
# fields and diagnostic bundles are the operators' and admins' to read, not the viewers'.
DIAGNOSTICS = OPERATE

ROLES: dict[str, tuple[str, ...]] = {
    "viewer": (VIEW,),
    "operator": (VIEW, OPERATE),
    "approver": (VIEW, APPROVE),
    "admin": (VIEW, OPERATE, APPROVE, ADMINISTER),
}


def tenants_for(user: User | AnonymousUser, perm: str = VIEW) -> QuerySet[Tenant]:
    """The tenants on which ``user`` holds ``perm`` (all of them for a superuser)."""
    if not user.is_authenticated:
        return Tenant.objects.none()
    if user.is_superuser:
        return Tenant.objects.all()
    tenants: QuerySet[Tenant] = get_objects_for_user(user, perm, klass=Tenant, accept_global_perms=False)
    return tenants


def can(user: User | AnonymousUser, tenant: Tenant, perm: str) -> bool:
    return user.is_authenticated and (user.is_superuser or user.has_perm(perm, tenant))
