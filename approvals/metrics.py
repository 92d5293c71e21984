"""The approvals app's families of ``/metrics``: UNKNOWN outcomes and their reconciliation
(the cases), and approval requests. Read at scrape time like the ledger's
(``ledger/observability/database.py``); ``approvals.apps`` registers this collector beside the
ledger's (``ledger.observability.metrics.register``), so ``/metrics`` and ``manage.py
metrics`` answer both."""

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.db.models import Count, F, Min, Q, Sum
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from approvals.models import OPEN_CASE_STATUSES, ApprovalRequest, ApprovalStatus, ReconciliationCase
from ledger.observability.database import DatabaseCollector, Scrape, counter, gauge

# Time spent in UNKNOWN, from the case's opening to its resolution.
UNKNOWN_BUCKETS_S = (60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600)
BY_RECONCILER = Q(resolved_by__startswith="reconciler:")


def open_cases(scrape: Scrape) -> Iterator[Metric]:
    """UNKNOWN outcomes waiting for a reconciler or a person, and the age of the oldest."""
    rows = list(
        ReconciliationCase.objects.filter(status__in=OPEN_CASE_STATUSES)
        .values("tenant_id", "status")
        .annotate(n=Count("id"), oldest=Min("opened_at"))
        .order_by()
    )
    yield gauge(
        "unknown_outcomes",
        "Open reconciliation cases (UNKNOWN effects), by case status: LOOKUP is a reconciler's, the rest people's",
        ["tenant", "status"],
        scrape.by_tenant(rows, "status"),
    )
    oldest: dict[str, float] = {}
    for row in rows:
        if row["tenant_id"] in scrape.tenants:
            tenant_slug = scrape.slug(row["tenant_id"])
            oldest[tenant_slug] = max((scrape.now - row["oldest"]).total_seconds(), oldest.get(tenant_slug, 0.0))
    yield gauge(
        "fenceline_unknown_outcome_oldest_age_seconds",
        "Age of the oldest open UNKNOWN case",
        ["tenant"],
        sorted(oldest.items()),
    )


def settled_cases(scrape: Scrape) -> Iterator[Metric]:
    """UNKNOWN effects settled, by who settled them, and how long they spent in UNKNOWN."""
    buckets = {
        f"le_{s}": Count("id", filter=Q(resolved_at__lte=F("opened_at") + timedelta(seconds=s)))
        for s in UNKNOWN_BUCKETS_S
    }
    settled: list[dict[str, Any]] = [
        dict(row)
        for row in ReconciliationCase.objects.filter(status="RESOLVED")
        .values("tenant_id")
        .annotate(
            n=Count("id"),
            person=Count("id", filter=~BY_RECONCILER),
            reconciler=Count("id", filter=BY_RECONCILER),
            seconds=Sum(F("resolved_at") - F("opened_at")),
            **buckets,
        )
        .order_by()
    ]
    reconciliations = CounterMetricFamily(
        "reconciliations", "UNKNOWN effects settled (RECONCILED), by who settled them", labels=["tenant", "source"]
    )
    in_unknown = HistogramMetricFamily(
        "unknown_outcome_duration_seconds",
        "Time settled UNKNOWN effects spent in UNKNOWN, from the case's opening to its resolution",
        labels=["tenant"],
    )
    for done in settled:
        if done["tenant_id"] not in scrape.tenants:
            continue
        tenant_slug = scrape.slug(done["tenant_id"])
        reconciliations.add_metric([tenant_slug, "person"], done["person"])
        reconciliations.add_metric([tenant_slug, "reconciler"], done["reconciler"])
        counts = [(str(float(s)), float(done[f"le_{s}"])) for s in UNKNOWN_BUCKETS_S]
        counts.append(("+Inf", float(done["n"])))
        total = done["seconds"].total_seconds() if done["seconds"] is not None else 0.0
        in_unknown.add_metric([tenant_slug], counts, total)
    yield reconciliations
    yield in_unknown


def approval_requests(scrape: Scrape) -> Iterator[Metric]:
    """Every request interrupted a run; those pending wait for a person now."""
    rows = list(
        ApprovalRequest.objects.values("tenant_id", "kind")
        .annotate(
            n=Count("id"), pending=Count("id", filter=Q(status=ApprovalStatus.PENDING, expires_at__gt=scrape.now))
        )
        .order_by()
    )
    yield counter(
        "approval_interruptions",
        "Approval requests opened (a run waited for a person), by kind",
        ["tenant", "kind"],
        scrape.by_tenant(rows, "kind"),
    )
    yield gauge(
        "fenceline_approvals_pending",
        "Approval requests waiting for a person",
        ["tenant", "kind"],
        scrape.by_tenant(rows, "kind", value="pending"),
    )


class ApprovalsMetrics(DatabaseCollector):
    """The approvals app's families."""

    families = (open_cases, settled_cases, approval_requests)
