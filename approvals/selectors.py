"""Reads of the decision queues, scoped to a console user's tenants, keyset-paginated so a
page costs the same few queries whatever the queue's length."""

import base64
import json
import uuid
from datetime import datetime

from django.db.models import Q

from approvals.models import (
    OPEN_CASE_STATUSES,
    ApprovalRequest,
    ApprovalStatus,
    ReconciliationCase,
)
from ledger.roles import VIEW, tenants_for

PAGE_SIZE = 50


def _visible_tenant_ids(user) -> list[int]:
    """Read first (one small query), so the queue query is a plain ``tenant_id IN (...)``
    that the planner combines with the queue's page-order index."""
    return list(tenants_for(user, VIEW).values_list("pk", flat=True))


def cases_for(user):
    return ReconciliationCase.objects.filter(tenant_id__in=_visible_tenant_ids(user))


def approvals_for(user):
    return ApprovalRequest.objects.filter(tenant_id__in=_visible_tenant_ids(user))


def encode_cursor(moment: datetime, pk: uuid.UUID) -> str:
    raw = json.dumps([moment.isoformat(), str(pk)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID] | None:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        moment, pk = json.loads(raw)
        return datetime.fromisoformat(moment), uuid.UUID(pk)
    except (ValueError, TypeError):
        return None


def keyset_page(queryset, *, order_field: str, cursor: str | None, size: int = PAGE_SIZE, descending: bool = False):
    """One page ordered by (order_field, id) after ``cursor`` (newest first when
    ``descending``); returns (rows, next_cursor)."""
    sign, after_op = ("-", "lt") if descending else ("", "gt")
    queryset = queryset.order_by(f"{sign}{order_field}", f"{sign}id")
    after = decode_cursor(cursor) if cursor else None
    if after is not None:
        moment, pk = after
        queryset = queryset.filter(
            Q(**{f"{order_field}__{after_op}": moment}) | Q(**{order_field: moment, f"id__{after_op}": pk})
        )
    rows = list(queryset[: size + 1])
    if len(rows) > size:
        rows = rows[:size]
        last = rows[-1]
        return rows, encode_cursor(getattr(last, order_field), last.pk)
    return rows, None


CASE_FILTERS = {
    "open": OPEN_CASE_STATUSES,
    "OPEN": ("OPEN",),
    "CLAIMED": ("CLAIMED",),
    "ESCALATED": ("ESCALATED",),
    "RESOLVED": ("RESOLVED",),
}


def case_queue(*, user, status: str = "open", cursor: str | None = None):
    statuses = CASE_FILTERS.get(status, OPEN_CASE_STATUSES)
    queryset = cases_for(user).filter(status__in=statuses).select_related("operation", "run", "tenant")
    return keyset_page(queryset, order_field="opened_at", cursor=cursor)


APPROVAL_FILTERS = {
    "PENDING": (ApprovalStatus.PENDING,),
    "EXPIRED": (ApprovalStatus.EXPIRED,),
    "decided": (ApprovalStatus.APPROVED, ApprovalStatus.DENIED, ApprovalStatus.USED, ApprovalStatus.VOID),
    "all": tuple(ApprovalStatus.values),
}


def approval_queue(*, user, status: str = "PENDING", cursor: str | None = None):
    statuses = APPROVAL_FILTERS.get(status, APPROVAL_FILTERS["PENDING"])
    queryset = approvals_for(user).filter(status__in=statuses).select_related("operation", "capability", "run", "tenant")
    return keyset_page(queryset, order_field="expires_at", cursor=cursor)
