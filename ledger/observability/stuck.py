"""Stuck runs (issue 40): an ACTIVE run that has had no lease, or made no progress (no
operation transition, progress checkpoint or event of its own: ``Run.last_progress_at``),
for longer than its tenant's ``stuck_after_s`` (the policy; 900 s on the starter policy).

One definition, read three ways: the runs list's "stuck" filter (:func:`stuck_condition`),
the dashboard's card and ``/metrics``' ``fenceline_stuck_runs`` (:func:`stuck_counts`, each
count a LIMITed walk of one tenant's ACTIVE runs, index ``run_active_tenant``), and the flag on a run
row or page (:func:`stuck_reason`, from columns the page has read already).

No index reads ``last_progress_at`` (every transition writes it: an index on it would make
the run's head updates non-HOT, docs/architecture.md); the ACTIVE runs are the bound instead.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Case, DateTimeField, F, OuterRef, Q, Subquery, Value, When
from django.db.models.fields.json import KT
from django.db.models.functions import Coalesce
from django.db.models.lookups import LessThan

from ledger.models import Run, RunLease, Tenant, TenantPolicy
from ledger.policy import STARTER_POLICY
from ledger.sql.reads import CappedCount
from ledger.states import RunStatus

DEFAULT_STUCK_AFTER_S: int = STARTER_POLICY["stuck_after_s"]
# /metrics counts each tenant's stuck runs up to this many (a bounded walk, like the dashboard's).
STUCK_METRIC_CAP = 1_000  # the dashboard's cap too: a scrape reads at most 1,001 runs a tenant


def stuck_limits(tenant_ids: list[int]) -> dict[int, int]:
    """Each tenant's ``stuck_after_s`` from its current policy, in one query (the key alone,
    not the documents); the starter's for a tenant whose policy predates the key."""
    limits = dict.fromkeys(tenant_ids, DEFAULT_STUCK_AFTER_S)
    rows = (
        TenantPolicy.objects.filter(tenant_id__in=tenant_ids, version=F("tenant__policy_version"))
        .annotate(limit=KT("document__stuck_after_s"))
        .values_list("tenant_id", "limit")
    )
    for tenant_id, raw in rows:
        if raw is not None and str(raw).isdigit() and int(raw) > 0:
            limits[tenant_id] = int(raw)
    return limits


def _quiet_before(cutoff: Any) -> Q:
    """No progress, or no lease, since before ``cutoff`` (a time or an OuterRef to one). A
    lease that ended (or expired) sets its ``expires_at`` to when; a run never leased has
    neither, and counts from its creation. The lease's expiry is read per run by its key (a
    scalar subquery): a join here let the planner hash every lease of the table to count a
    thousand runs (200 ms at 200k runs)."""
    lease_end = Subquery(RunLease.objects.filter(run_id=OuterRef("pk")).values("expires_at")[:1])
    return Q(LessThan(Coalesce("last_progress_at", "created_at"), cutoff)) | Q(
        LessThan(Coalesce(lease_end, "created_at"), cutoff)
    )


def stuck_condition(limits: dict[int, int], *, now: datetime) -> Q:
    """The runs of these tenants (``stuck_limits``) that are stuck at ``now``: one condition
    per distinct limit (most tenants share the starter's)."""
    by_limit: dict[int, list[int]] = {}
    for tenant_id, limit_s in limits.items():
        by_limit.setdefault(limit_s, []).append(tenant_id)
    condition = Q(pk__in=[])
    for limit_s, tenant_ids in sorted(by_limit.items()):
        condition |= Q(tenant_id__in=tenant_ids) & _quiet_before(now - timedelta(seconds=limit_s))
    return Q(status=RunStatus.ACTIVE) & condition


def stuck_counts(tenant_ids: list[int], *, cap: int, now: datetime) -> dict[int, int]:
    """Per tenant, its stuck runs counted up to ``cap + 1`` (one more: "more than the cap"),
    in one statement: each count a LIMITed walk of its ACTIVE runs (``run_active_tenant``)."""
    if not tenant_ids:
        return {}
    limits = stuck_limits(tenant_ids)
    cutoffs = [When(pk=pk, then=Value(now - timedelta(seconds=limit_s))) for pk, limit_s in limits.items()]
    stuck = (
        Run.objects.filter(tenant_id=OuterRef("pk"), status=RunStatus.ACTIVE)
        .filter(_quiet_before(OuterRef("cutoff")))
        .values("pk")[: cap + 1]
    )
    counted = (
        Tenant.objects.filter(pk__in=tenant_ids)
        .annotate(cutoff=Case(*cutoffs, output_field=DateTimeField()))
        .annotate(n=CappedCount(stuck))
        .values_list("pk", "n")
    )
    return dict(counted)


@dataclass(frozen=True)
class Stuck:
    """Why a run is flagged: since when it has had no lease (None: it holds one) and no
    progress, and the tenant's limit."""

    no_lease_since: datetime | None
    quiet_since: datetime
    limit_s: int
    now: datetime

    @property
    def no_lease(self) -> bool:
        return self.no_lease_since is not None and (self.now - self.no_lease_since).total_seconds() > self.limit_s

    @property
    def no_progress(self) -> bool:
        return (self.now - self.quiet_since).total_seconds() > self.limit_s

    @property
    def limit_text(self) -> str:
        """The tenant's limit for people: "15 min", "2 h", "90 s"."""
        minutes, seconds = divmod(self.limit_s, 60)
        if seconds or not minutes:
            return f"{self.limit_s} s"
        return f"{minutes // 60} h" if minutes % 60 == 0 else f"{minutes} min"


def stuck_reason(run: Run, *, limit_s: int, now: datetime) -> Stuck | None:
    """Whether ``run`` (with its lease loaded) is stuck at ``now``: the :class:`Stuck`, or None."""
    if run.status != RunStatus.ACTIVE:
        return None
    lease = run.lease
    held = lease.owner_id is not None and lease.expires_at is not None and lease.expires_at > now
    flagged = Stuck(
        no_lease_since=None if held else (lease.expires_at or run.created_at),
        quiet_since=run.last_progress_at or run.created_at,
        limit_s=limit_s,
        now=now,
    )
    return flagged if flagged.no_lease or flagged.no_progress else None
