"""Webhook notifications, conditions become deliveries: for each enabled endpoint and each kind it asks for, the
current conditions of its tenant that have no delivery to it yet, at most ``batch_size`` per
kind and endpoint and pass, inserted with ON CONFLICT DO NOTHING on (endpoint, dedupe key).
Running twice at once, or again, inserts nothing twice. Read-only on everything else. The
conditions are the people's queues (cases, approvals) and the ledger's (alerts, workers, runs,
breakers), so the scan lives here, above both; the endpoints, their bodies and the deliveries
are the ledger's (``ledger/services/notifications/``).

| kind             | condition                                  | dedupe key                               |
|------------------|--------------------------------------------|------------------------------------------|
| unknown_aged     | an open case older than unknown_after_s    | unknown:<case id>                        |
| approval_pending | a PENDING approval not yet expired         | approval:<approval id>                   |
| cleanup_alert    | an open ResourceAlert                      | cleanup:<alert id>                       |
| quarantine       | a QUARANTINED worker                       | quarantine:<worker id>:<since>           |
| chain_broken     | a run whose chain the verifier found BROKEN| broken:<run id>                          |
| breaker_change   | a breaker change after the endpoint began  | breaker:<tenant id>:<state>:<changed at> |
| case_escalated   | a case escalated (by a person or the case  | escalated:<case id>                      |
|                  | timers) after the endpoint began           |                                          |

A person's own route (``PersonalRoute``, ``ledger/services/notifications/routes.py``) gets:

| kind        | when                                                    | dedupe key                      |
|-------------|---------------------------------------------------------|---------------------------------|
| my_approval | (this scan) a PENDING approval, not expired, asked since| myapproval:<approval id>        |
|             | the route was set, on a tenant where the person now     |                                 |
|             | holds APPROVE                                           |                                 |
| my_case     | (``my_case_notify``, called by the case services) a case| mycase:<case id>:<what>:<at>    |
|             | handed to the person, or escalated on a tenant they     |                                 |
|             | administer, while they hold the role there              |                                 |

Neither ever names a case or approval of a tenant where the person holds no such role.
"""

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import CharField, Exists, OuterRef, Q, Value
from django.db.models.functions import Cast, Concat
from django.utils import timezone
from guardian.shortcuts import get_users_with_perms

from approvals.models import OPEN_CASE_STATUSES, ApprovalRequest, ApprovalStatus, CaseStatus, ReconciliationCase
from ledger.models import PersonalRoute, ResourceAlert, Run, Tenant, WebhookDelivery, WebhookEndpoint, Worker
from ledger.models.notifications import DeliveryStatus, NotificationKind, PersonalKind
from ledger.roles import APPROVE, can, tenants_for
from ledger.services.notifications.body import build_body
from ledger.states import WorkerStatus

logger = logging.getLogger(__name__)


@dataclass
class ScanPass:
    endpoints: int = 0
    created: int = 0
    refused: int = 0  # bodies the secret boundary refused: recorded GAVE_UP, never sent
    by_kind: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Found:
    """One current condition: its dedupe key and what its body says."""

    key: str
    headline: str
    subject: dict[str, Any]
    path: str


def _key(prefix: str, *parts: str) -> Any:
    """The dedupe key as a database expression, so the search for conditions without a
    delivery and the key inserted are spelled the same way."""
    pieces: list[Any] = [Value(prefix)]
    for i, part in enumerate(parts):
        if i:
            pieces.append(Value(":"))
        pieces.append(Cast(part, CharField()))
    return Concat(*pieces, output_field=CharField())


def _undelivered(endpoint: WebhookEndpoint) -> Any:
    """Filter for rows annotated with ``dedupe`` that have no delivery to ``endpoint``."""
    return ~Exists(WebhookDelivery.objects.filter(endpoint_id=endpoint.pk, dedupe_key=OuterRef("dedupe")))


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min" if seconds >= 60 else f"{int(seconds)} s"


def _unknown_aged(endpoint: WebhookEndpoint, now: datetime, limit: int) -> Iterator[Found]:
    qs = ReconciliationCase.objects.filter(
        tenant_id=endpoint.tenant_id,
        status__in=OPEN_CASE_STATUSES,
        opened_at__lte=now - timedelta(seconds=endpoint.unknown_after_s),
    )
    qs = qs.annotate(dedupe=_key("unknown:", "id")).filter(_undelivered(endpoint)).order_by("opened_at")
    for row in qs.values(
        "dedupe",
        "id",
        "run_id",
        "operation_id",
        "reason",
        "status",
        "opened_at",
        "operation__tool",
        "operation__action",
    )[:limit]:
        tool = f"{row['operation__tool']}.{row['operation__action']}"
        yield Found(
            key=row["dedupe"],
            headline=f"UNKNOWN outcome of {tool} unresolved for {_minutes((now - row['opened_at']).total_seconds())}"
            f" (case {str(row['id'])[:8]}, {row['reason']}, {row['status']})",
            subject={
                "case_id": str(row["id"]),
                "run_id": str(row["run_id"]),
                "operation_id": str(row["operation_id"]),
                "tool": row["operation__tool"],
                "action": row["operation__action"],
                "case_reason": row["reason"],
                "case_status": row["status"],
                "opened_at": row["opened_at"],
            },
            path="/cases/",
        )


def _approval_pending(endpoint: WebhookEndpoint, now: datetime, limit: int) -> Iterator[Found]:
    qs = ApprovalRequest.objects.filter(tenant_id=endpoint.tenant_id, status=ApprovalStatus.PENDING, expires_at__gt=now)
    qs = qs.annotate(dedupe=_key("approval:", "id")).filter(_undelivered(endpoint)).order_by("requested_at")
    for row in qs.values(
        "dedupe",
        "id",
        "run_id",
        "kind",
        "operation_id",
        "operation__tool",
        "operation__action",
        "requested_at",
        "expires_at",
    )[:limit]:
        what = f"{row['operation__tool']}.{row['operation__action']}" if row["operation__tool"] else row["kind"]
        yield Found(
            key=row["dedupe"],
            headline=f"Approval pending: {what} (run {str(row['run_id'])[:8]}), expires {row['expires_at']:%H:%M} UTC",
            subject={
                "approval_id": str(row["id"]),
                "run_id": str(row["run_id"]),
                "approval_kind": row["kind"],
                "operation_id": str(row["operation_id"]) if row["operation_id"] else None,
                "tool": row["operation__tool"],
                "action": row["operation__action"],
                "requested_at": row["requested_at"],
                "expires_at": row["expires_at"],
            },
            path="/approvals/",
        )


def _cleanup_alert(endpoint: WebhookEndpoint, now: datetime, limit: int) -> Iterator[Found]:
    qs = ResourceAlert.objects.filter(tenant_id=endpoint.tenant_id, cleared_at__isnull=True)
    qs = qs.annotate(dedupe=_key("cleanup:", "id")).filter(_undelivered(endpoint)).order_by("raised_at")
    for row in qs.values(
        "dedupe",
        "id",
        "resource_id",
        "resource__run_id",
        "resource__kind",
        "resource__provider",
        "resource__attempts",
        "reason",
        "raised_at",
    )[:limit]:
        yield Found(
            key=row["dedupe"],
            headline=f"Cleanup alert ({row['reason']}): {row['resource__kind']} of run "
            f"{str(row['resource__run_id'])[:8]} not closed after {row['resource__attempts']} attempts",
            subject={
                "alert_id": str(row["id"]),
                "resource_id": str(row["resource_id"]),
                "run_id": str(row["resource__run_id"]),
                "resource_kind": row["resource__kind"],
                "provider": row["resource__provider"],
                "attempts": row["resource__attempts"],
                "alert_reason": row["reason"],
                "raised_at": row["raised_at"],
            },
            path="/resources/",
        )


def _quarantine(endpoint: WebhookEndpoint, now: datetime, limit: int) -> Iterator[Found]:
    qs = Worker.objects.filter(tenant_id=endpoint.tenant_id, status=WorkerStatus.QUARANTINED)
    qs = (
        qs.annotate(dedupe=_key("quarantine:", "id", "status_changed_at"))
        .filter(_undelivered(endpoint))
        .order_by("status_changed_at")
    )
    for row in qs.values("dedupe", "id", "name", "status_changed_at", "status_changed_by", "status_reason")[:limit]:
        by = f" by {row['status_changed_by']}" if row["status_changed_by"] else ""
        yield Found(
            key=row["dedupe"],
            headline=f"Worker {row['name']} quarantined{by}: {row['status_reason']}",
            subject={
                "worker_id": row["id"],
                "worker": row["name"],
                "changed_by": row["status_changed_by"],
                "reason": row["status_reason"],
                "since": row["status_changed_at"],
            },
            path=f"/workers/{row['id']}/",
        )


def _chain_broken(endpoint: WebhookEndpoint, now: datetime, limit: int) -> Iterator[Found]:
    qs = Run.objects.filter(tenant_id=endpoint.tenant_id).filter(~Q(broken_reason=""))
    qs = qs.annotate(dedupe=_key("broken:", "id")).filter(_undelivered(endpoint)).order_by("-created_at")
    for row in qs.values("dedupe", "id", "broken_reason", "broken_first_seq", "broken_last_seq")[:limit]:
        yield Found(
            key=row["dedupe"],
            headline=f"Evidence chain BROKEN: run {str(row['id'])[:8]} ({row['broken_reason']}"
            f" at seq {row['broken_first_seq']})",
            subject={
                "run_id": str(row["id"]),
                "broken_reason": row["broken_reason"],
                "first_seq": row["broken_first_seq"],
                "last_seq": row["broken_last_seq"],
            },
            path=f"/runs/{row['id']}/",
        )


def _breaker_change(endpoint: WebhookEndpoint, now: datetime, limit: int) -> Iterator[Found]:
    # A change, not a state: only changes made since the endpoint was set up.
    qs = Tenant.objects.filter(pk=endpoint.tenant_id, breaker_changed_at__gte=endpoint.created_at)
    qs = qs.annotate(dedupe=_key("breaker:", "id", "breaker_state", "breaker_changed_at")).filter(
        _undelivered(endpoint)
    )
    for row in qs.values("dedupe", "slug", "breaker_state", "breaker_reason", "breaker_changed_at")[:limit]:
        yield Found(
            key=row["dedupe"],
            headline=f"Cost breaker is now {row['breaker_state']}: {row['breaker_reason']}",
            subject={
                "state": row["breaker_state"],
                "reason": row["breaker_reason"],
                "since": row["breaker_changed_at"],
            },
            path=f"/tenants/{row['slug']}/#budgets",
        )


def _case_escalated(endpoint: WebhookEndpoint, now: datetime, limit: int) -> Iterator[Found]:
    qs = ReconciliationCase.objects.filter(
        tenant_id=endpoint.tenant_id, status=CaseStatus.ESCALATED, escalated_at__gte=endpoint.created_at
    )
    qs = qs.annotate(dedupe=_key("escalated:", "id")).filter(_undelivered(endpoint)).order_by("escalated_at")
    for row in qs.values(
        "dedupe",
        "id",
        "run_id",
        "operation_id",
        "tool",
        "provider",
        "reason",
        "opened_at",
        "escalated_at",
        "escalated_by",
        "escalation_reason",
        "claimed_by",
    )[:limit]:
        yield Found(
            key=row["dedupe"],
            headline=f"Case {str(row['id'])[:8]} ({row['tool']}, {row['reason']}) escalated by "
            f"{row['escalated_by']}: {row['escalation_reason']}",
            subject={
                "case_id": str(row["id"]),
                "run_id": str(row["run_id"]),
                "operation_id": str(row["operation_id"]),
                "tool": row["tool"],
                "provider": row["provider"],
                "case_reason": row["reason"],
                "opened_at": row["opened_at"],
                "escalated_at": row["escalated_at"],
                "escalated_by": row["escalated_by"],
                "reason": row["escalation_reason"],
                "held_by": row["claimed_by"],
            },
            path="/cases/?status=ESCALATED",
        )


FINDERS: dict[str, Callable[[WebhookEndpoint, datetime, int], Iterator[Found]]] = {
    NotificationKind.UNKNOWN_AGED: _unknown_aged,
    NotificationKind.APPROVAL_PENDING: _approval_pending,
    NotificationKind.CLEANUP_ALERT: _cleanup_alert,
    NotificationKind.QUARANTINE: _quarantine,
    NotificationKind.CHAIN_BROKEN: _chain_broken,
    NotificationKind.BREAKER_CHANGE: _breaker_change,
    NotificationKind.CASE_ESCALATED: _case_escalated,
}


def notifications_scan(*, batch_size: int | None = None, now: datetime | None = None) -> ScanPass:
    """One pass over every enabled endpoint (see the module docstring). Idempotent."""
    now = now or timezone.now()
    limit = batch_size or settings.FENCELINE["NOTIFY_SCAN_BATCH_SIZE"]
    result = ScanPass()
    for endpoint in WebhookEndpoint.objects.filter(enabled=True).select_related("tenant").order_by("pk"):
        result.endpoints += 1
        rows: list[WebhookDelivery] = []
        for kind in endpoint.kinds:
            finder = FINDERS.get(kind)
            if finder is None:
                continue
            for found in finder(endpoint, now, limit):
                body = build_body(
                    kind=kind,
                    tenant_slug=endpoint.tenant.slug,
                    headline=found.headline,
                    subject=found.subject,
                    path=found.path,
                    at=now,
                )
                refused = body is None
                rows.append(
                    WebhookDelivery(
                        endpoint=endpoint,
                        tenant_id=endpoint.tenant_id,
                        kind=kind,
                        dedupe_key=found.key[:200],
                        body=body or {},
                        status=DeliveryStatus.GAVE_UP if refused else DeliveryStatus.PENDING,
                        last_error="secret_boundary" if refused else "",
                        next_attempt_at=now,
                        created_at=now,
                    )
                )
        if not rows:
            continue
        # ON CONFLICT DO NOTHING: a concurrent pass that inserted the same key wins, silently.
        # The ids are made here, so the rows that are in the table afterwards are ours.
        WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)
        ours = WebhookDelivery.objects.filter(pk__in=[row.pk for row in rows])
        for kind, status in ours.values_list("kind", "status"):
            result.by_kind[kind] = result.by_kind.get(kind, 0) + 1
            result.created += 1
            result.refused += status == DeliveryStatus.GAVE_UP
    _routes_scan(now=now, limit=limit, result=result)
    if result.refused:
        logger.warning("notifications: %d body(ies) refused by the secret boundary, not sent", result.refused)
    return result


# --- a person's own route ------------------------------------------------------------------


def _route_delivery(
    route: PersonalRoute, *, tenant: Tenant, kind: str, key: str, found: Found, now: datetime
) -> WebhookDelivery:
    body = build_body(
        kind=kind, tenant_slug=tenant.slug, headline=found.headline, subject=found.subject, path=found.path, at=now
    )
    return WebhookDelivery(
        route=route,
        tenant=tenant,
        kind=kind,
        dedupe_key=key[:200],
        body=body or {},
        status=DeliveryStatus.PENDING if body else DeliveryStatus.GAVE_UP,
        last_error="" if body else "secret_boundary",
        next_attempt_at=now,
        created_at=now,
    )


def _routes_scan(*, now: datetime, limit: int, result: ScanPass) -> None:
    """my_approval: each enabled route that asks for it gets the PENDING approvals of the
    tenants where its person holds APPROVE now, asked since the route was set."""
    routes = PersonalRoute.objects.filter(enabled=True, kinds__contains=[PersonalKind.MY_APPROVAL])
    for route in routes.select_related("user").order_by("pk"):
        if not route.user.is_active:
            continue
        qs = ApprovalRequest.objects.filter(
            tenant__in=tenants_for(route.user, APPROVE),
            status=ApprovalStatus.PENDING,
            expires_at__gt=now,
            requested_at__gte=route.created_at,
        )
        qs = qs.annotate(dedupe=_key("myapproval:", "id")).filter(
            ~Exists(WebhookDelivery.objects.filter(route_id=route.pk, dedupe_key=OuterRef("dedupe")))
        )
        rows = []
        for approval in qs.select_related("tenant", "operation").order_by("requested_at")[:limit]:
            op = approval.operation
            what = f"{op.tool}.{op.action}" if op else approval.kind
            found = Found(
                key=f"myapproval:{approval.pk}",
                headline=f"Approval awaits you: {what} (run {str(approval.run_id)[:8]}), "
                f"expires {approval.expires_at:%H:%M} UTC",
                subject={
                    "approval_id": str(approval.pk),
                    "run_id": str(approval.run_id),
                    "approval_kind": approval.kind,
                    "tool": op.tool if op else None,
                    "action": op.action if op else None,
                    "expires_at": approval.expires_at,
                },
                path="/approvals/",
            )
            rows.append(
                _route_delivery(
                    route, tenant=approval.tenant, kind=PersonalKind.MY_APPROVAL, key=found.key, found=found, now=now
                )
            )
        if rows:
            WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)
            made = WebhookDelivery.objects.filter(pk__in=[row.pk for row in rows]).count()
            result.created += made
            result.by_kind[PersonalKind.MY_APPROVAL] = result.by_kind.get(PersonalKind.MY_APPROVAL, 0) + made


def my_case_notify(
    *, case: ReconciliationCase, usernames: list[str], perm: str, what: str, headline: str, now: datetime | None = None
) -> int:
    """A case was handed to (or escalated towards) ``usernames``: each of them whose route
    asks for my_case, and who holds ``perm`` on the case's tenant now, gets one delivery
    (``what`` tells this hand-over from another: "reassigned", "escalated"). Returns how
    many were made. Called by the case services after their transition committed."""
    now = now or timezone.now()
    routes = PersonalRoute.objects.filter(
        enabled=True, kinds__contains=[PersonalKind.MY_CASE], user__username__in=usernames, user__is_active=True
    ).select_related("user")
    tenant = Tenant.objects.get(pk=case.tenant_id)
    op = case.operation
    rows = []
    for route in routes:
        if not can(route.user, tenant, perm):  # never another tenant's case
            continue
        found = Found(
            key=f"mycase:{case.pk}:{what}:{now.isoformat()}",
            headline=headline,
            subject={
                "case_id": str(case.pk),
                "run_id": str(case.run_id),
                "operation_id": str(case.operation_id),
                "tool": op.tool,
                "action": op.action,
                "case_reason": case.reason,
                "case_status": case.status,
            },
            path="/cases/?status=mine" if what == "reassigned" else "/cases/",
        )
        rows.append(
            _route_delivery(route, tenant=tenant, kind=PersonalKind.MY_CASE, key=found.key, found=found, now=now)
        )
    WebhookDelivery.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def tenant_admins(tenant_id: int) -> list[str]:
    """The usernames of the tenant's admins (an escalated case goes up to them)."""
    tenant = Tenant.objects.get(pk=tenant_id)
    users = get_users_with_perms(tenant, only_with_perms_in=["administer_tenant"], with_superusers=False)
    return sorted(str(getattr(u, "username", u)) for u in users)
