"""Reads of the decision queues, scoped to a console user's tenants, keyset-paginated so a
page costs the same few queries whatever the queue's length."""

from approvals.models import (
    OPEN_CASE_STATUSES,
    PEOPLE_CASE_STATUSES,
    ApprovalRequest,
    ApprovalStatus,
    CaseStatus,
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


# Names are matched case-insensitively (console.views.common.chosen): no two may differ only
# in case ("unclaimed" is the cases in status OPEN).
CASE_FILTERS = {
    "open": PEOPLE_CASE_STATUSES,  # what waits for people; LOOKUP is still with a reconciler
    "unclaimed": (CaseStatus.OPEN,),  # waiting for someone to take it
    "mine": (CaseStatus.CLAIMED,),  # claimed by the one asking (see case_queue)
    "LOOKUP": ("LOOKUP",),
    "unresolved": OPEN_CASE_STATUSES,
    "CLAIMED": ("CLAIMED",),
    "ESCALATED": ("ESCALATED",),
    "RESOLVED": ("RESOLVED",),
    "all": tuple(CaseStatus.values),
}
# The queue's orders: by how long a case has waited (oldest first, or newest first).
SORTS = ("oldest", "newest")


def case_queue(*, user, status: str = "open", cursor: str | None = None, sort: str = "oldest"):
    """A page of the cases ``user`` sees in filter ``status`` (CASE_FILTERS; "mine" are the
    cases the user holds), by age, with their comment threads."""
    statuses = CASE_FILTERS.get(status, PEOPLE_CASE_STATUSES)
    queryset = cases_for(user).filter(status__in=statuses)
    if status == "mine":
        queryset = queryset.filter(claimed_by=user.get_username())
    queryset = queryset.select_related("operation", "run", "tenant").prefetch_related("comments")
    return keyset_page(queryset, order_field="opened_at", cursor=cursor, descending=sort == "newest")


APPROVAL_FILTERS = {
    "PENDING": (ApprovalStatus.PENDING,),
    "APPROVED": (ApprovalStatus.APPROVED,),
    "DENIED": (ApprovalStatus.DENIED,),
    "USED": (ApprovalStatus.USED,),
    "VOID": (ApprovalStatus.VOID,),
    "EXPIRED": (ApprovalStatus.EXPIRED,),
    "decided": (ApprovalStatus.APPROVED, ApprovalStatus.DENIED, ApprovalStatus.USED, ApprovalStatus.VOID),
    "all": tuple(ApprovalStatus.values),
}
# expiring: soonest expiry first (what must be decided first); oldest / newest: by when asked.
APPROVAL_SORTS = ("expiring", "oldest", "newest")


def approval_queue(*, user, status: str = "PENDING", cursor: str | None = None, sort: str = "expiring"):
    statuses = APPROVAL_FILTERS.get(status, APPROVAL_FILTERS["PENDING"])
    queryset = (
        approvals_for(user).filter(status__in=statuses).select_related("operation", "capability", "run", "tenant")
    )
    if sort == "expiring":
        return keyset_page(queryset, order_field="expires_at", cursor=cursor)
    return keyset_page(queryset, order_field="requested_at", cursor=cursor, descending=sort == "newest")
