"""Granting roles: a user gets exactly one role on a tenant (see ledger.roles)."""

from django.contrib.auth import get_user_model
from django.db import transaction
from guardian.shortcuts import assign_perm, remove_perm

from ledger.models import Tenant
from ledger.roles import ROLES
from ledger.services.errors import InvalidInput


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
