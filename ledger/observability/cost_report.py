"""What the cost breaker's levers did, per tenant, over a recent window (issue 39, item 5):
cost by provider, the cents held by UNKNOWN reservations, what retries cost, how often a
dispatch's worker took a fallback, and denials by reason.

Read by the tenant page (``ledger.admin_selectors.tenant_detail_parts``) and by ``/metrics``
(``ledger.observability.database.levers``). Three aggregate statements, each over an index
bounded by the window or by a partial index holding only the rows it counts:

* the reservations made in the window (``reservation_tenant_created``): one per dispatched
  attempt with an estimate or a cost limit (under a tenant limit, every dispatch), with its
  operation's ``fallback_used`` joined by primary key;
* the UNKNOWN reservations, whenever made (``reservation_tenant_unknown``: the UNKNOWN rows only);
* the OPERATION_DENIED events of the window (``event_denied_recent``: those events only), by
  their ``decision`` (the operation's own row is not indexed by phase: its phase changes stay
  HOT updates).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Q, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce

from ledger.models import CostReservation, Event
from ledger.states import ReservationState

# How far back the report looks (the UNKNOWN cents excepted: they are held until reconciled).
REPORT_WINDOW = timedelta(hours=1)
# The most providers reported per tenant, by cents; the rest are summed as OTHER (a provider is
# named by the worker's intent, so its count is not bounded by the policy).
MAX_PROVIDERS = 20
OTHER = "(other)"
NO_PROVIDER = "(none)"


@dataclass
class ProviderCost:
    provider: str
    dispatches: int = 0
    settled_cents: int = 0
    reserved_cents: int = 0  # still RESERVED (in flight)
    unknown_cents: int = 0  # reserved by dispatches of the window whose outcome is UNKNOWN


@dataclass
class LeverReport:
    """One tenant's report over ``since`` .. now."""

    since: datetime
    providers: list[ProviderCost] = field(default_factory=list)
    unknown_reserved_cents: int = 0  # every UNKNOWN reservation of the tenant, whenever made
    unknown_reservations: int = 0
    retry_cents: int = 0  # settled (or still held) by attempts 2 and later
    retry_dispatches: int = 0
    dispatches: int = 0
    fallback_dispatches: int = 0  # the worker's outcome said fallback_used: true
    denials: dict[str, int] = field(default_factory=dict)  # decision code -> count

    @property
    def fallback_rate(self) -> float | None:
        """The share of the window's dispatches whose worker took a fallback (None: none)."""
        return self.fallback_dispatches / self.dispatches if self.dispatches else None

    @property
    def settled_cents(self) -> int:
        return sum(p.settled_cents for p in self.providers)


HELD = (ReservationState.RESERVED, ReservationState.UNKNOWN)


def lever_reports(*, since: datetime, tenant_id: int | None = None) -> dict[int, LeverReport]:
    """Each tenant's :class:`LeverReport` (only ``tenant_id``'s when given), by tenant id; a
    tenant with nothing to report is absent."""
    reports: dict[int, LeverReport] = {}

    def report(pk: int) -> LeverReport:
        return reports.setdefault(pk, LeverReport(since=since))

    scope = Q() if tenant_id is None else Q(tenant_id=tenant_id)
    _by_provider(scope, since, report)
    unknown = (
        CostReservation.objects.filter(scope, state=ReservationState.UNKNOWN)
        .values("tenant_id")
        .annotate(cents=Sum("estimated_cents"), n=Count("id"))
        .order_by()
    )
    for row in unknown:
        r = report(row["tenant_id"])
        r.unknown_reserved_cents, r.unknown_reservations = int(row["cents"] or 0), row["n"]
    denied = (
        Event.objects.filter(
            Q() if tenant_id is None else Q(run__tenant_id=tenant_id), type="OPERATION_DENIED", occurred_at__gte=since
        )
        .annotate(code=KT("fields__decision"))
        .values("run__tenant_id", "code")
        .annotate(n=Count("id"))
        .order_by()
    )
    for denial in denied:
        report(denial["run__tenant_id"]).denials[denial["code"] or "DENIED"] = denial["n"]
    for r in reports.values():
        r.denials = dict(sorted(r.denials.items(), key=lambda kv: (-kv[1], kv[0])))
    return reports


def _by_provider(scope: Q, since: datetime, report: Callable[[int], LeverReport]) -> None:
    """The window's reservations, by tenant and provider: dispatches, cents, retries, fallbacks."""
    spent = Coalesce(Sum("actual_cents", filter=Q(state=ReservationState.SETTLED)), 0)
    rows = (
        CostReservation.objects.filter(scope, created_at__gte=since)
        .values("tenant_id", "provider")
        .annotate(
            n=Count("id"),
            settled=spent,
            reserved=Coalesce(Sum("estimated_cents", filter=Q(state=ReservationState.RESERVED)), 0),
            unknown=Coalesce(Sum("estimated_cents", filter=Q(state=ReservationState.UNKNOWN)), 0),
            retry_settled=Coalesce(Sum("actual_cents", filter=Q(state=ReservationState.SETTLED, attempt__gt=1)), 0),
            retry_held=Coalesce(Sum("estimated_cents", filter=Q(state__in=HELD, attempt__gt=1)), 0),
            retries=Count("id", filter=Q(attempt__gt=1)),
            fallbacks=Count("id", filter=Q(operation__fallback_used=True)),
        )
        .order_by()
    )
    providers: dict[int, list[ProviderCost]] = {}
    for row in rows:
        r = report(row["tenant_id"])
        r.dispatches += row["n"]
        r.retry_cents += int(row["retry_settled"] + row["retry_held"])
        r.retry_dispatches += row["retries"]
        r.fallback_dispatches += row["fallbacks"]
        providers.setdefault(row["tenant_id"], []).append(
            ProviderCost(
                provider=row["provider"] or NO_PROVIDER,
                dispatches=row["n"],
                settled_cents=int(row["settled"]),
                reserved_cents=int(row["reserved"]),
                unknown_cents=int(row["unknown"]),
            )
        )
    for tenant_id, costs in providers.items():
        costs.sort(key=lambda p: (-(p.settled_cents + p.reserved_cents + p.unknown_cents), p.provider))
        kept, rest = costs[:MAX_PROVIDERS], costs[MAX_PROVIDERS:]
        if rest:
            kept.append(
                ProviderCost(
                    provider=OTHER,
                    dispatches=sum(p.dispatches for p in rest),
                    settled_cents=sum(p.settled_cents for p in rest),
                    reserved_cents=sum(p.reserved_cents for p in rest),
                    unknown_cents=sum(p.unknown_cents for p in rest),
                )
            )
        report(tenant_id).providers = kept


def lever_report(*, tenant_id: int, now: datetime) -> LeverReport:
    """One tenant's report over the last :data:`REPORT_WINDOW` (an empty one when nothing happened)."""
    since = now - REPORT_WINDOW
    return lever_reports(since=since, tenant_id=tenant_id).get(tenant_id) or LeverReport(since=since)
