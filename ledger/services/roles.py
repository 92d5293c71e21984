"""Granting roles (a user gets exactly one role on a tenant, see ledger.roles), and the
parts every person's decision shares (invariant 8): who acts (a console user, whose role on
the object's tenant every service re-checks, or, for reconcilers, jobs and tests, a plain
name), why (a reason through the secret boundary), and the tenant's AdminAction record."""

import re

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from guardian.shortcuts import assign_perm, remove_perm

from ledger.boundary import check_text
from ledger.models import AdminAction, Tenant
from ledger.roles import ADMINISTER, ROLES, can
from ledger.services.errors import Forbidden, InvalidInput

USERNAME = re.compile(r"[\w.@+-]{1,150}")
MAX_REASON_LENGTH = 500  # the reason columns (AdminAction, CredentialLease, Worker, ...)


@transaction.atomic
def role_grant(
    *, username: str, tenant: Tenant, role: str, password: str | None = None, user=None, reason: str = ""
):
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
            actor=f"user:{granted_by}",
            action="role.grant",
            subject=f"{username} as {role}",
            reason=reason,
            fields={"username": username, "role": role, "created": created},
        )
    return account, created


def acting_name(*, user, name: str, tenant_id: object, perm: str) -> str:
    """The name to record for the decision; raises Forbidden when ``user`` lacks ``perm``."""
    if user is None:
        return name
    tenant = Tenant.objects.get(pk=tenant_id)
    if not can(user, tenant, perm):
        raise Forbidden("your role on this tenant does not allow this action")
    return user.username


def decision_reason(reason: object) -> str:
    """The reason of a person's decision: required, at most MAX_REASON_LENGTH characters,
    through the secret boundary (it is stored, put in events and shown); returned stripped."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("a decision gives its reason")
    reason = reason.strip()
    if len(reason) > MAX_REASON_LENGTH:
        raise InvalidInput(f"reason must be at most {MAX_REASON_LENGTH} characters")
    check_text(reason, path="reason")
    return reason


def admin_action_record(
    *, tenant: Tenant, actor: str, action: str, subject: str, reason: str, fields: dict | None = None, now=None
) -> AdminAction:
    """The tenant's record of a person's decision about it (in the caller's transaction)."""
    return AdminAction.objects.create(
        tenant=tenant,
        occurred_at=now or timezone.now(),
        actor=actor,
        action=action,
        subject=subject[:300],
        reason=reason,
        fields=fields or {},
    )
