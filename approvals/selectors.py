"""Reads of the decision queues, scoped to a console user's tenants, keyset-paginated so a
page costs the same few queries whatever the queue's length; the worker API's approval; and
the reads that put the people's queues beside the ledger's (a run's operations with their
cases, liveness, the dashboard's counts and trends), composed with ``ledger.selectors`` and
``ledger.trends``, which read nothing of this app."""

from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F, Max, OuterRef, Prefetch, Q, QuerySet
from django.db.models.functions import TruncHour
from django.utils import timezone

from approvals.models import (
    OPEN_CASE_STATUSES,
    PEOPLE_CASE_STATUSES,
    ApprovalRequest,
    ApprovalStatus,
    CaseStatus,
    ReconciliationCase,
)
from ledger import selectors as ledger_selectors
from ledger import trends as ledger_trends
from ledger.actors import reconciler_actor
from ledger.errors import NotFound, parse_id
from ledger.models import EffectDelivery, EffectDeliveryRecord, Operation, Run, Tenant, Worker
from ledger.pagination import PAGE_SIZE, Page, keyset_page
from ledger.policy import case_timers_of
from ledger.roles import VIEW, tenants_for
from ledger.services.core.handoff import UnknownTime
from ledger.services.core.policy_documents import policy_document
from ledger.sql import rows as sql_rows
from ledger.sql.reads import CappedCount


def _visible_tenant_ids(user: User | AnonymousUser) -> list[int]:
    """Read first (one small query), so the queue query is a plain ``tenant_id IN (...)``
    that the planner combines with the queue's page-order index."""
    return list(tenants_for(user, VIEW).values_list("pk", flat=True))


def cases_for(user: User | AnonymousUser) -> QuerySet[ReconciliationCase]:
    return ReconciliationCase.objects.filter(tenant_id__in=_visible_tenant_ids(user))


def approvals_for(user: User | AnonymousUser) -> QuerySet[ApprovalRequest]:
    return ApprovalRequest.objects.filter(tenant_id__in=_visible_tenant_ids(user))


# Names are matched case-insensitively (console.views.common.chosen): no two may differ only
# in case ("unclaimed" is the cases in status OPEN).
CASE_FILTERS = {
    "open": PEOPLE_CASE_STATUSES,  # what waits for people; LOOKUP is still with a reconciler
    "unclaimed": (CaseStatus.OPEN,),  # waiting for someone to take it
    "mine": (CaseStatus.CLAIMED, CaseStatus.ESCALATED),  # held by the one asking (see case_queue)
    "LOOKUP": ("LOOKUP",),
    "unresolved": OPEN_CASE_STATUSES,
    "CLAIMED": ("CLAIMED",),
    "ESCALATED": ("ESCALATED",),
    "RESOLVED": ("RESOLVED",),
    "all": tuple(CaseStatus.values),
}
# The queue's orders: by how long a case has waited (oldest first, or newest first).
SORTS = ("oldest", "newest")


def case_queue(
    *,
    user: User | AnonymousUser,
    status: str = "open",
    cursor: str | None = None,
    back: str | None = None,
    size: int = PAGE_SIZE,
    sort: str = "oldest",
) -> Page[ReconciliationCase]:
    """A page of the cases ``user`` sees in filter ``status`` (CASE_FILTERS; "mine" are the
    cases the user holds), by age, with their comment threads."""
    statuses = CASE_FILTERS.get(status, PEOPLE_CASE_STATUSES)
    queryset = cases_for(user).filter(status__in=statuses)
    if status == "mine":
        queryset = queryset.filter(claimed_by=user.get_username())
    queryset = queryset.select_related("operation", "run", "tenant").prefetch_related("comments")
    return keyset_page(
        queryset, order_field="opened_at", cursor=cursor, back=back, size=size, descending=sort == "newest"
    )


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


def approval_queue(
    *,
    user: User | AnonymousUser,
    status: str = "PENDING",
    cursor: str | None = None,
    back: str | None = None,
    size: int = PAGE_SIZE,
    sort: str = "expiring",
) -> Page[ApprovalRequest]:
    statuses = APPROVAL_FILTERS.get(status, APPROVAL_FILTERS["PENDING"])
    queryset = (
        approvals_for(user).filter(status__in=statuses).select_related("operation", "capability", "run", "tenant")
    )
    if sort == "expiring":
        return keyset_page(queryset, order_field="expires_at", cursor=cursor, back=back, size=size)
    return keyset_page(
        queryset, order_field="requested_at", cursor=cursor, back=back, size=size, descending=sort == "newest"
    )


# --- the worker API -------------------------------------------------------------------------


def approval_get(*, tenant: Tenant, approval_id: object) -> ApprovalRequest:
    """An approval request of ``tenant`` (``GET /api/v1/approvals/{id}``: another tenant's is
    404), by a pre-built statement."""
    approval = sql_rows.get(ApprovalRequest, tenant_id=tenant.pk, id=parse_id(approval_id, "approval"))
    if not isinstance(approval, ApprovalRequest):
        raise NotFound("approval not found")
    return approval


# --- the run page ---------------------------------------------------------------------------


def run_operations(*, run: Run, limit: int = 100) -> list[Operation]:
    """The run's operations in the page's order, each with its reconciliation cases (newest
    attempt first), its delivery states (newest attempt first) and its delivery records
    (newest first): four queries."""
    cases = ReconciliationCase.objects.order_by("-attempt")
    deliveries = EffectDelivery.objects.order_by("-attempt")
    records = EffectDeliveryRecord.objects.order_by("-recorded_at", "-pk")
    return list(
        ledger_selectors.run_operations(run=run).prefetch_related(
            Prefetch("cases", queryset=cases),
            Prefetch("deliveries", queryset=deliveries),
            Prefetch("delivery_records", queryset=records),
        )[:limit]
    )


def unknown_time(cases: QuerySet[ReconciliationCase], now: datetime) -> UnknownTime:
    """How long outcomes of these cases were (or still are) UNKNOWN: open ones count to now."""
    rows = list(cases.values_list("status", "opened_at", "resolved_at"))
    open_since = [opened for status, opened, _ in rows if status in OPEN_CASE_STATUSES]
    spent = sum(((resolved or now) - opened).total_seconds() for _, opened, resolved in rows)
    return {
        "open_cases": len(open_since),
        "seconds_in_unknown": round(spent, 1),
        "unknown_since": min(open_since) if open_since else None,
    }


def run_unknown_time(*, run: Run, now: datetime) -> UnknownTime:
    return unknown_time(ReconciliationCase.objects.filter(run=run), now)


def worker_unknown_time(*, worker: Worker, now: datetime) -> UnknownTime:
    """The cases of effects the worker dispatched (under a token of its own)."""
    mine = ReconciliationCase.objects.filter(
        operation__run__lease_grants__worker=worker,
        operation__run__lease_grants__fencing_token=F("operation__fencing_token"),
    )
    return unknown_time(mine, now)


def run_liveness(*, run: Run, now: datetime | None = None) -> dict[str, Any]:
    """The run's liveness states (``ledger.selectors.run_liveness``) with its time in UNKNOWN."""
    now = now or timezone.now()
    return ledger_selectors.run_liveness(run=run, unknown=run_unknown_time(run=run, now=now), now=now)


def worker_liveness(*, worker: Worker, now: datetime | None = None) -> dict[str, Any]:
    """The worker's liveness states (``ledger.selectors.worker_liveness``) with the time the
    effects it dispatched spent in UNKNOWN."""
    now = now or timezone.now()
    return ledger_selectors.worker_liveness(worker=worker, unknown=worker_unknown_time(worker=worker, now=now), now=now)


# --- the dashboard --------------------------------------------------------------------------


def dashboard_counts(*, user: User | AnonymousUser) -> dict[str, Any]:
    """What needs a person now, per visible tenant: the ledger's counts
    (``ledger.selectors.dashboard_counts``) with the people's queues beside them: open cases,
    of which still being looked up (both counted up to ``DASHBOARD_COUNT_CAP``), UNKNOWNs
    settled in the last 24 h, pending approvals."""
    counts = ledger_selectors.dashboard_counts(user=user)
    cap = ledger_selectors.DASHBOARD_COUNT_CAP
    rows = {row["tenant"].pk: row for row in counts["tenants"]}
    for row in rows.values():
        row.update(open_unknown=0, with_reconciler=0, pending_approvals=0)
    settled: dict[str, Any] = {"by_reconciler": 0, "by_people": 0, "mean": None, "longest": None}
    if rows:
        for tenant_id, counted in _open_cases(list(rows)).items():
            for name, n in counted.items():
                rows[tenant_id][name] = min(n, cap)
                if n > cap:
                    rows[tenant_id]["capped"].add(name)
        settled = _settled_in_a_day(list(rows), now=counts["now"])
        for r in (
            ApprovalRequest.objects.filter(
                tenant_id__in=rows, status=ApprovalStatus.PENDING, expires_at__gt=counts["now"]
            )
            .values("tenant_id")
            .annotate(n=Count("id"))
            .order_by()
        ):
            rows[r["tenant_id"]]["pending_approvals"] = r["n"]
    per_tenant = counts["tenants"]
    return {
        **counts,
        "open_unknown": sum(r["open_unknown"] for r in per_tenant),
        "with_reconciler": sum(r["with_reconciler"] for r in per_tenant),
        "settled_24h": settled,
        "pending_approvals": sum(r["pending_approvals"] for r in per_tenant),
        "capped": set().union(*(r["capped"] for r in per_tenant)),  # a total of an "at least" is one too
    }


def _settled_in_a_day(ids: list[int], *, now: datetime) -> dict[str, Any]:
    """UNKNOWNs settled in the last 24 h, by reconcilers and by people, and the time they
    spent in UNKNOWN (index case_resolved_recent)."""
    in_unknown = ExpressionWrapper(F("resolved_at") - F("opened_at"), output_field=DurationField())
    by_reconciler = Q(resolved_by__startswith="reconciler:")
    settled = ReconciliationCase.objects.filter(
        tenant_id__in=ids, status="RESOLVED", resolved_at__gte=now - timedelta(hours=24)
    ).aggregate(
        by_reconciler=Count("id", filter=by_reconciler),
        by_people=Count("id", filter=~by_reconciler),
        mean=Avg(in_unknown),
        longest=Max(in_unknown),
    )
    settled["mean"] = ledger_selectors.span_text(settled["mean"])
    settled["longest"] = ledger_selectors.span_text(settled["longest"])
    return settled


def _open_cases(ids: list[int]) -> dict[int, dict[str, int]]:
    """Per tenant: its open cases, and of those the ones still being looked up, each counted
    up to ``DASHBOARD_COUNT_CAP + 1`` (one more means "more than the cap"): one statement,
    each count a LIMITed walk of an index (case_open_tenant, case_queue) rather than every row."""
    limit = ledger_selectors.DASHBOARD_COUNT_CAP + 1
    of_tenant = ReconciliationCase.objects.filter(tenant_id=OuterRef("pk"))
    counted = Tenant.objects.filter(pk__in=ids).annotate(
        o=CappedCount(of_tenant.filter(status__in=OPEN_CASE_STATUSES).values("pk")[:limit]),
        k=CappedCount(of_tenant.filter(status=CaseStatus.LOOKUP).values("pk")[:limit]),
    )
    return {
        tenant_id: {"open_unknown": o, "with_reconciler": k} for tenant_id, o, k in counted.values_list("pk", "o", "k")
    }


def dashboard_trends(*, user: User | AnonymousUser, now: datetime | None = None) -> dict[str, Any]:
    """The dashboard's trends: the ledger's (``ledger.trends.dashboard_trends``: stale-token
    rejections, cost burn, verification lag) and the UNKNOWN effects opened and settled per
    hour, by people and by reconcilers, over the same 24 clock hours and tenants."""
    trends = ledger_trends.dashboard_trends(user=user, now=now)
    return {**trends, "unknown": _unknown_per_hour(trends["tenant_ids"], ledger_trends.trend_hours(trends["now"]))}


def _unknown_per_hour(ids: list[int], hours: list[datetime]) -> dict[str, Any]:
    """Cases opened per hour (index ``case_queue``: tenant, status, opened_at) and settled per
    hour (``case_resolved_recent``: tenant, resolved_at): two queries, none without tenants."""
    since = hours[0]
    opened: dict[datetime, int] = {}
    settled: dict[datetime, dict[str, int]] = {}
    by_reconciler = Q(resolved_by__startswith=reconciler_actor(""))  # "reconciler:<name>"
    if ids:
        for hour, n in (
            ReconciliationCase.objects.filter(tenant_id__in=ids, status__in=CaseStatus.values, opened_at__gte=since)
            .annotate(hour=TruncHour("opened_at"))
            .values_list("hour")
            .annotate(n=Count("*"))
            .order_by()
        ):
            opened[hour] = n
        for row in (
            ReconciliationCase.objects.filter(tenant_id__in=ids, status=CaseStatus.RESOLVED, resolved_at__gte=since)
            .annotate(hour=TruncHour("resolved_at"))
            .values("hour")
            .annotate(by_reconciler=Count("id", filter=by_reconciler), by_people=Count("id", filter=~by_reconciler))
            .order_by()
        ):
            settled[row["hour"]] = {"by_people": row["by_people"], "by_reconciler": row["by_reconciler"]}
    rows = [
        {
            "hour": hour,
            "opened": opened.get(hour, 0),
            "by_people": settled.get(hour, {}).get("by_people", 0),
            "by_reconciler": settled.get(hour, {}).get("by_reconciler", 0),
        }
        for hour in hours
    ]
    return {
        "rows": rows,
        "opened": sum(r["opened"] for r in rows),
        "by_people": sum(r["by_people"] for r in rows),
        "by_reconciler": sum(r["by_reconciler"] for r in rows),
    }


# --- case groups and timers -----------------------------------------------------------------

# A group is formed among at most this many of the cases waiting for people, the longest
# waiting first (a LIMITed walk of an index, whatever the queue's length); past it the page
# says the groups are of the oldest ones.
GROUP_SCAN_CAP = 2000
GROUPS_SHOWN = 12
# The most cases one group action touches (its preview lists each).
GROUP_ACTION_CAP = 200
GROUP_KEY = ("tenant_id", "tool", "provider", "reason", "verdict")


def case_groups(*, user: User | AnonymousUser, cap: int = GROUP_SCAN_CAP) -> dict[str, Any]:
    """Similar cases waiting for people (OPEN, CLAIMED, ESCALATED), grouped by tenant, tool,
    provider, reason and the reconciler's last verdict: the groups of two or more, largest
    first, each with its count and age range (oldest and newest opened_at), among the ``cap``
    longest-waiting cases the user sees. One LIMITed walk of index ``case_open_queue`` in
    (opened_at, id) order reads their keys; they are counted here (a GROUP BY over an
    ``IN (subquery)`` makes PostgreSQL scan the whole table)."""
    ids = _visible_tenant_ids(user)
    if not ids:
        return {"groups": [], "capped": False, "cap": cap}
    rows = list(
        ReconciliationCase.objects.filter(tenant_id__in=ids, status__in=PEOPLE_CASE_STATUSES)
        .order_by("opened_at", "id")
        .values_list(*GROUP_KEY, "opened_at")[: cap + 1]
    )
    capped = len(rows) > cap
    counted: dict[tuple[Any, ...], dict[str, Any]] = {}
    for *key, opened_at in rows[:cap]:
        group = counted.get(tuple(key))
        if group is None:
            counted[tuple(key)] = {
                **dict(zip(GROUP_KEY, key, strict=True)),
                "n": 1,
                "oldest": opened_at,
                "newest": opened_at,
            }
        else:
            group["n"] += 1
            group["newest"] = opened_at  # rows come oldest first
    groups = sorted((g for g in counted.values() if g["n"] >= 2), key=lambda g: (-g["n"], g["oldest"]))[:GROUPS_SHOWN]
    slugs = dict(Tenant.objects.filter(pk__in={g["tenant_id"] for g in groups}).values_list("pk", "slug"))
    for group in groups:
        group["tenant_slug"] = slugs.get(group["tenant_id"], "")
    return {"groups": groups, "capped": capped, "cap": cap}


def group_case_ids(*, user: User | AnonymousUser, key: dict[str, Any], limit: int = GROUP_ACTION_CAP) -> list[str]:
    """The ids of the cases in the group ``key`` (GROUP_KEY's fields) that wait for people and
    the user sees, the longest waiting first, at most ``limit`` (index ``case_group``)."""
    ids = _visible_tenant_ids(user)
    if key.get("tenant_id") not in ids:
        return []
    rows = ReconciliationCase.objects.filter(status__in=PEOPLE_CASE_STATUSES, **{k: key[k] for k in GROUP_KEY})
    return [str(pk) for pk in rows.order_by("opened_at", "id").values_list("pk", flat=True)[:limit]]


def case_timers_by_tenant(tenant_ids: set[int]) -> dict[int, dict[str, int]]:
    """Each tenant's case timers (its current policy's ``case_timers``)."""
    return {
        tenant.pk: case_timers_of(policy_document(tenant, tenant.policy_version))
        for tenant in Tenant.objects.filter(pk__in=tenant_ids).only("pk", "slug", "policy_version")
    }


def with_case_deadlines(cases: list[ReconciliationCase], *, now: datetime | None = None) -> list[ReconciliationCase]:
    """Each case with its timer: ``deadline`` (when its claim expires, CLAIMED;
    when it escalates, OPEN; None otherwise), ``deadline_kind`` ("claim expires" /
    "escalates") and ``overdue`` (the job has not caught up yet). One query for the timers."""
    now = now or timezone.now()
    timers = case_timers_by_tenant({case.tenant_id for case in cases})
    for case in cases:
        deadline, kind = _deadline(case, timers.get(case.tenant_id))
        setattr(case, "deadline", deadline)  # noqa: B010 - shown beside the row, not a field
        setattr(case, "deadline_kind", kind)  # noqa: B010
        setattr(case, "overdue", deadline is not None and deadline <= now)  # noqa: B010
    return cases


def _deadline(case: ReconciliationCase, timers: dict[str, int] | None) -> tuple[datetime | None, str]:
    if timers is None:
        return None, ""
    if case.status == CaseStatus.CLAIMED and case.claimed_at is not None:
        return case.claimed_at + timedelta(seconds=timers["ack_s"]), "claim expires"
    if case.status == CaseStatus.OPEN:
        return case.opened_at + timedelta(seconds=timers["escalate_s"]), "escalates"
    return None, ""
