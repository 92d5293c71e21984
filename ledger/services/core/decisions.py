"""What every person's decision shares (invariant 8): who acts — a console user, whose role
on the object's tenant every service re-checks, or, for commands, jobs and tests, a plain
name — why (a reason through the secret boundary), and the tenant's AdminAction record.
The actor string itself is spelled by ``ledger.actors.user_actor``."""

from datetime import datetime
from typing import Any

from django.utils import timezone

from ledger.boundary import check_text
from ledger.errors import Forbidden, InvalidInput
from ledger.models import AdminAction, Tenant
from ledger.roles import can

MAX_REASON_LENGTH = 500  # the reason columns (AdminAction, CredentialLease, Worker, ...)


def acting_name(*, user: Any, name: str, tenant_id: int, perm: str) -> str:
    """The name to record for the decision; raises Forbidden when ``user`` lacks ``perm``."""
    if user is None:
        return name
    tenant = Tenant.objects.get(pk=tenant_id)
    if not can(user, tenant, perm):
        raise Forbidden("your role on this tenant does not allow this action")
    return str(user.username)


def decision_reason(reason: object) -> str:
    """The reason of a person's decision: required, at most MAX_REASON_LENGTH characters,
    through the secret boundary (it is stored, put in events and shown); returned stripped."""
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInput("a decision gives its reason", field="reason")
    reason = reason.strip()
    if len(reason) > MAX_REASON_LENGTH:
        raise InvalidInput(f"reason must be at most {MAX_REASON_LENGTH} characters", field="reason")
    check_text(reason, path="reason")
    return reason


def admin_action_record(
    *,
    tenant: Tenant,
    actor: str,
    action: str,
    subject: str,
    reason: str,
    fields: dict[str, Any] | None = None,
    now: datetime | None = None,
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
