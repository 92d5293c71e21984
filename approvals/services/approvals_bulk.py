"""Deciding several approval requests at once, with one decision and one reason: first a
preview of exactly the requests it will touch, then all of them or none. Each decision is
``approval_decide``'s own (one event in each run's chain, naming the approver)."""

import uuid
from collections.abc import Iterable

from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services.approvals import approval_decide
from ledger.errors import Forbidden, InvalidInput, NotFound, WrongPhase, parse_id
from ledger.roles import APPROVE, can, tenants_for
from ledger.services.core.decisions import decision_reason


def _ids(raw_ids: Iterable[object]) -> set[uuid.UUID]:
    ids: set[uuid.UUID] = set()
    for raw in raw_ids:
        try:
            ids.add(parse_id(raw, "approval"))
        except NotFound:
            continue
    return ids


def approvals_preview(*, approval_ids: Iterable[object], user: User | AnonymousUser) -> list[ApprovalRequest]:
    """Exactly the requests a bulk decision by ``user`` on ``approval_ids`` will touch: those
    still PENDING and not expired, on tenants where the user may approve, in the order they
    will be decided (soonest expiry first)."""
    return list(
        ApprovalRequest.objects.filter(
            pk__in=_ids(approval_ids),
            status=ApprovalStatus.PENDING,
            expires_at__gt=timezone.now(),
            tenant__in=tenants_for(user, APPROVE),
        )
        .select_related("operation", "capability", "run", "tenant")
        .order_by("expires_at", "id")
    )


def approvals_decide_bulk(
    *, approval_ids: Iterable[object], user: User | AnonymousUser, approve: bool, reason: str
) -> list[ApprovalRequest]:
    """Approve (or deny) several requests with one reason, all or none: every one must still
    be PENDING, unexpired and on a tenant where ``user`` may approve, or nothing changes."""
    reason = decision_reason(reason)
    wanted = {parse_id(raw, "approval") for raw in approval_ids}
    if not wanted:
        raise InvalidInput("choose at least one request", field="approval")
    found = list(ApprovalRequest.objects.filter(pk__in=wanted).select_related("tenant").order_by("expires_at", "id"))
    if len(found) != len(wanted):
        raise NotFound("approval not found")
    now = timezone.now()
    for approval in found:
        if not can(user, approval.tenant, APPROVE):
            raise Forbidden("your role on this tenant does not allow this action")
        if approval.status != ApprovalStatus.PENDING or approval.expires_at <= now:
            shown = ApprovalStatus.EXPIRED if approval.status == ApprovalStatus.PENDING else approval.status
            raise WrongPhase(phase=f"request {str(approval.pk)[:8]} {shown}", wanted=ApprovalStatus.PENDING)
    with transaction.atomic():
        return [
            approval_decide(approval_id=approval.pk, approve=approve, reason=reason, user=user) for approval in found
        ]
