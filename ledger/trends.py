"""The dashboard's trends in the ledger: what happened per hour over the last 24 hours, and
where each visible tenant stands now, read in a constant number of queries (the tenants with
their current policy and newest verified checkpoint, then at most three more), each bounded by
the time window or by the tenants and walking an index:

    stale-token rejections per hour    events by ``event_stale_recent`` (occurred_at) INCLUDE
                                       (run_id) WHERE type = STALE_TOKEN_REJECTED, each run
                                       by its primary key for the tenant
    cost burn                          each tenant's current TENANT window by
                                       ``costwindow_unique``, its shards by ``costshard_unique``
    verification lag                   the newest verified checkpoint by ``run_verified``
                                       (one backward step per tenant, with the tenants and
                                       their policies); runs started within 24 h by
                                       ``run_tenant_recent`` (or ``run_recent``)

Hours are clock hours (UTC): the 23 whole hours before the current one, and the current
one so far. Only the tenants where the user has a role are read (``tenants_for``). The
dashboard shows these beside the UNKNOWN effects opened and settled per hour, which the
approvals app reads from its cases (``approvals.selectors.dashboard_trends``).
"""

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Count, F, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce, TruncHour
from django.utils import timezone

from ledger.models import CostWindow, Event, Run, Tenant, TenantPolicy
from ledger.observability.health import job_allowed_s
from ledger.policy import PolicyDocument, completed_policy
from ledger.roles import tenants_for
from ledger.services.authority.windows import window_bounds
from ledger.states import BudgetKind

HOURS = 24
BREAKER_MARKS = ("throttled_at", "degraded_at", "open_at")


def verifier_allowance_s() -> int:
    """How long the verify-ledger job may go without finishing before it is not fresh: the
    lag it is allowed."""
    return round(job_allowed_s("verify-ledger"))


def trend_hours(now: datetime) -> list[datetime]:
    """The starts of the 24 clock hours that end with the current one."""
    current = now.replace(minute=0, second=0, microsecond=0)
    return [current - timedelta(hours=HOURS - 1 - i) for i in range(HOURS)]


def dashboard_trends(*, user: User | AnonymousUser, now: datetime | None = None) -> dict[str, Any]:
    """The ledger's charts for ``user``'s tenants (see the module docstring), with the
    tenants' ids (``tenant_ids``) for the charts read beside them."""
    now = now or timezone.now()
    hours = trend_hours(now)
    since = hours[0]
    policy = TenantPolicy.objects.filter(tenant=OuterRef("pk"), version=OuterRef("policy_version"))
    newest = Run.objects.filter(
        tenant_id=OuterRef("pk"), verified_checkpoint_seq__isnull=False, verified_at__isnull=False
    ).order_by("-verified_at")
    tenants = list(
        tenants_for(user)
        .annotate(
            policy_document=Subquery(policy.values("document")[:1]),
            last_verified_at=Subquery(newest.values("verified_at")[:1]),
        )
        .order_by("slug")
    )
    ids = [t.pk for t in tenants]
    refused: dict[datetime, int] = {}
    recent_runs: dict[int, dict[str, Any]] = {}
    windows: dict[int, CostWindow] = {}
    policies = {t.pk: completed_policy(getattr(t, "policy_document", None) or {}) for t in tenants}
    if ids:
        for hour, n in (
            Event.objects.filter(type="STALE_TOKEN_REJECTED", occurred_at__gte=since, run__tenant_id__in=ids)
            .annotate(hour=TruncHour("occurred_at"))
            .values_list("hour")
            .annotate(n=Count("*"))
            .order_by()
        ):
            refused[hour] = n
        windows = _current_tenant_windows(tenants, policies, now)
        unverified = Q(verified_head_seq__isnull=True) | Q(verified_head_seq__lt=F("last_seq"))
        for run_row in (
            Run.objects.filter(tenant_id__in=ids, created_at__gte=now - timedelta(hours=HOURS))
            .values("tenant_id")
            .annotate(
                runs=Count("*"),
                runs_waiting=Count("id", filter=unverified),
                events_unverified=Sum(F("last_seq") - Coalesce("verified_head_seq", 0)),
                events_unsealed=Sum(F("last_seq") - Coalesce("verified_checkpoint_seq", 0)),
            )
            .order_by()
        ):
            recent_runs[run_row["tenant_id"]] = {k: v for k, v in run_row.items() if k != "tenant_id"}
    stale_rows = [{"hour": hour, "refused": refused.get(hour, 0)} for hour in hours]
    return {
        "now": now,
        "since": since,
        "tenants": len(tenants),
        "tenant_ids": ids,
        "stale": {"rows": stale_rows, "refused": sum(r["refused"] for r in stale_rows)},
        "cost": [_burn(t, policies[t.pk], windows.get(t.pk), now) for t in tenants],
        "verification": [_lag(t, recent_runs.get(t.pk, {}), now) for t in tenants],
        "verifier_allowance_s": verifier_allowance_s(),
    }


def _current_tenant_windows(
    tenants: Sequence[Tenant], policies: dict[int, PolicyDocument], now: datetime
) -> dict[int, CostWindow]:
    """Each limited tenant's TENANT window that contains ``now`` under its current policy
    (as the breaker reads it), with its shards' totals: one exact index probe per tenant."""
    probes = Q()
    for t in tenants:
        if policies[t.pk]["cost_limits_cents"]["tenant"] is not None:
            starts_at, _ = window_bounds(now, policies[t.pk]["cost_window_s"])
            probes |= Q(tenant_id=t.pk, key=t.slug, starts_at=starts_at)
    if not probes:
        return {}
    return {w.tenant_id: w for w in CostWindow.objects.filter(probes, kind=BudgetKind.TENANT).with_totals()}


def _burn(tenant: Tenant, policy: PolicyDocument, window: CostWindow | None, now: datetime) -> dict[str, Any]:
    """The tenant's spend in its current TENANT window against the limit and the breaker's
    thresholds (shares of the limit). No limit: ``limit_cents`` is None."""
    limit = policy["cost_limits_cents"]["tenant"]
    starts_at, ends_at = window_bounds(now, policy["cost_window_s"])
    reserved = settled = 0
    if window is not None:
        limit = window.limit_cents  # the limit the window was opened with
        reserved = getattr(window, "total_reserved_cents", 0)
        settled = getattr(window, "total_settled_cents", 0)
    used = reserved + settled
    return {
        "tenant": tenant,
        "limit_cents": limit,
        "reserved_cents": reserved,
        "settled_cents": settled,
        "used_cents": used,
        "share": (used / limit if limit else 1.0) if limit is not None else None,
        "thresholds": {name: policy["breaker"][name] for name in BREAKER_MARKS},
        "window_starts_at": starts_at,
        "window_ends_at": ends_at,
    }


def _lag(tenant: Tenant, recent: dict[str, Any], now: datetime) -> dict[str, Any]:
    """How far behind the verifier is in this tenant: the age of its newest verified
    checkpoint, and the runs started within 24 h with events it has not verified (or sealed)."""
    verified = getattr(tenant, "last_verified_at", None)
    return {
        "tenant": tenant,
        "last_verified_at": verified,
        "lag_s": max(0, int((now - verified).total_seconds())) if verified else None,
        "runs": recent.get("runs", 0),
        "runs_waiting": recent.get("runs_waiting", 0),
        "events_unverified": recent.get("events_unverified") or 0,
        "events_unsealed": recent.get("events_unsealed") or 0,
    }
