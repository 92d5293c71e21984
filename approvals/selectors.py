"""Reads of the decision queues, scoped to a console user's tenants, keyset-paginated so a
page costs the same few queries whatever the queue's length."""

from approvals.models import (
    OPEN_CASE_STATUSES,
    PEOPLE_CASE_STATUSES,
    ApprovalRequest,
    ApprovalStatus,
    ReconciliationCase,
)
from ledger.pagination import keyset_page
from ledger.roles import VIEW, tenants_for


def _visible_tenant_ids(user) -> list[int]:
    """Read first (one small query), so the queue query is a plain ``tenant_id IN (...)``
    that the planner combines with the queue's page-order index."""
    return list(tenants_for(user, VIEW).values_list("pk", flat=True))


def cases_for(user):
    return ReconciliationCase.objects.filter(tenant_id__in=_visible_tenant_ids(user))


def approvals_for(user):
    return ApprovalRequest.objects.filter(tenant_id__in=_visible_tenant_ids(user))


CASE_FILTERS = {
    "open": PEOPLE_CASE_STATUSES,  # what waits for people; LOOKUP is still with a reconciler
    "LOOKUP": ("LOOKUP",),
    "unresolved": OPEN_CASE_STATUSES,
    "OPEN": ("OPEN",),
    "CLAIMED": ("CLAIMED",),
    "ESCALATED": ("ESCALATED",),
    "RESOLVED": ("RESOLVED",),
}


def case_queue(*, user, status: str = "open", cursor: str | None = None):
    statuses = CASE_FILTERS.get(status, PEOPLE_CASE_STATUSES)
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
    queryset = (
        approvals_for(user).filter(status__in=statuses).select_related("operation", "capability", "run", "tenant")
    )
    return keyset_page(queryset, order_field="expires_at", cursor=cursor)
