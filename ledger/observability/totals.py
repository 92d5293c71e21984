"""What each tenant's runs add up to, as ``/metrics`` reads it (events accepted, runs BROKEN,
verification lag, UNKNOWN operations, active runs, operations in flight, the newest
verification): one pass over every run, so the ``count-run-totals`` job does it every
``RUN_TOTALS_INTERVAL_S`` and keeps the result in :class:`~ledger.models.RunTotals`
(``ledger/services/operating/totals.py``), and a scrape reads one row per tenant (at 1M runs
the pass took 156 ms of a 214 ms scrape).

A scrape uses the stored totals while they are as fresh as ``/readyz`` requires of the job
(:func:`~ledger.observability.health.job_allowed_s`); older or missing (the job stopped, or
has not run yet), it counts them itself, so a scrape is slow rather than wrong."""

from django.db.models import Count, F, Max, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from ledger.models import Run, RunTotals
from ledger.observability.health import job_allowed_s
from ledger.states import RunStatus

TOTALS = ("accepted", "broken", "lag", "unknown", "active", "in_flight", "verified_at")
JOB = "count-run-totals"  # its beat entry


def run_totals_count() -> list[RunTotals]:
    """Count now (unsaved rows): one aggregate over every run, grouped by tenant."""
    now = timezone.now()
    rows = (
        Run.objects.values("tenant_id")
        .annotate(
            accepted=Coalesce(Sum("last_seq"), 0),
            broken=Count("id", filter=~Q(broken_reason="")),
            lag=Coalesce(Sum(F("last_seq") - Coalesce("verified_checkpoint_seq", 0)), 0),
            unknown=Coalesce(Sum("n_unknown"), 0),
            active=Count("id", filter=Q(status=RunStatus.ACTIVE)),
            in_flight=Coalesce(Sum(F("n_authorized") + F("n_dispatched")), 0),
            verified_at=Max("verified_at"),
        )
        .order_by("tenant_id")
    )
    return [RunTotals(counted_at=now, **row) for row in rows]


def run_totals_read() -> list[RunTotals]:
    """The stored totals while the job keeps them fresh; else counted now."""
    stored = list(RunTotals.objects.order_by("tenant_id"))
    oldest = min((row.counted_at for row in stored), default=None)
    if oldest is None or (timezone.now() - oldest).total_seconds() > job_allowed_s(JOB):
        return run_totals_count()
    return stored
