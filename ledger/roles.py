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
from django.contrib.contenttypes.models import ContentType
from django.db.models import QuerySet
from guardian.models import UserObjectPermission
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


# Who may act, per permission, as the console says it where a role hides an action.
ACTORS_OF: dict[str, str] = {
    OPERATE: "Operators and admins",
    APPROVE: "Approvers and admins",
    ADMINISTER: "Admins",
}


def role_of(perms: set[str]) -> str:
    """The role a set of permissions on one tenant makes (the highest one it holds)."""
    for name in ("admin", "operator", "approver", "viewer"):
        if set(ROLES[name]) <= perms:
            return name
    return ""


def roles_of(user: User | AnonymousUser) -> list[tuple[Tenant, str]]:
    """Each tenant ``user`` holds a role on, with the role, by slug (two queries; a
    superuser, who sees every tenant, holds none: the console says "superuser" instead)."""
    if not user.is_authenticated or user.is_superuser:
        return []
    perms: dict[str, set[str]] = {}
    rows = UserObjectPermission.objects.filter(
        user_id=user.pk, content_type=ContentType.objects.get_for_model(Tenant)
    ).values_list("object_pk", "permission__codename")
    for object_pk, codename in rows:
        perms.setdefault(object_pk, set()).add(f"ledger.{codename}")
    tenants = Tenant.objects.filter(pk__in=[int(pk) for pk in perms]).order_by("slug")
    found = [(tenant, role_of(perms[str(tenant.pk)])) for tenant in tenants]
    return [(tenant, role) for tenant, role in found if role]
