"""Granting roles: a user gets exactly one role on a tenant (see ``ledger.roles``)."""

import re
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from guardian.shortcuts import assign_perm, remove_perm

from ledger.actors import user_actor
from ledger.boundary import check_text
from ledger.errors import InvalidInput
from ledger.models import Tenant
from ledger.roles import ADMINISTER, ROLES
from ledger.services.core.decisions import acting_name, admin_action_record, decision_reason

USERNAME = re.compile(r"[\w.@+-]{1,150}")


@transaction.atomic
def role_grant(
    *, username: str, tenant: Tenant, role: str, password: str | None = None, user: Any = None, reason: str = ""
) -> tuple[Any, bool]:
    """Give ``username`` (created when missing) exactly ``role`` on ``tenant``. Given a
    console ``user`` (an admin of the tenant, checked here), the grant is recorded with
    their name and ``reason``; the command line (``manage.py grant``) passes no user."""
    if role not in ROLES:
        raise InvalidInput(f"role must be one of {', '.join(ROLES)}")
    if not isinstance(username, str) or not USERNAME.fullmatch(username):
        raise InvalidInput("username must be 1 to 150 letters, digits and @ . + - _")
    check_text(username, path="username")  # it is shown on pages and kept in AdminAction
    granted_by = acting_name(user=user, name="", tenant_id=tenant.pk, perm=ADMINISTER)
    if user is not None:
        reason = decision_reason(reason)
        if username == user.username:
            raise InvalidInput("you cannot change your own role")
    User = get_user_model()
    account, created = User.objects.get_or_create(username=username)
    if password:
        account.set_password(password)
        account.save(update_fields=["password"])
    elif created:
        account.set_unusable_password()
        account.save(update_fields=["password"])
    for perm in {p for perms in ROLES.values() for p in perms}:
        remove_perm(perm, account, tenant)
    for perm in ROLES[role]:
        assign_perm(perm, account, tenant)
    if user is not None:
        admin_action_record(
            tenant=tenant,
            actor=user_actor(granted_by),
            action="role.grant",
            subject=f"{username} as {role}",
            reason=reason,
            fields={"username": username, "role": role, "created": created},
        )
    return account, created
