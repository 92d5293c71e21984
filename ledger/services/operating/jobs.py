"""The heartbeat of each periodic job: when it last started, finished or failed, how long it
took, and what its runs have done in total. Every Celery run of a beat job writes its row
(``ledger.tasks.job``); ``/readyz`` calls a job stale when it has not finished within
``JOB_STALE_AFTER_INTERVALS`` of its interval (``ledger.observability.health.job_allowed_s``),
and ``/metrics`` reads the totals."""

from collections.abc import Mapping
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from ledger.models import JobHeartbeat


def _row(name: str) -> JobHeartbeat:
    row, _ = JobHeartbeat.objects.select_for_update().get_or_create(name=name)
    return row


def job_started(name: str) -> datetime:
    now = timezone.now()
    with transaction.atomic():
        JobHeartbeat.objects.get_or_create(name=name)
        JobHeartbeat.objects.filter(name=name).update(last_started_at=now)
    return now


def job_finished(name: str, *, started_at: datetime, result: Mapping[str, object] | None) -> None:
    """One successful run: its counts are added to the job's totals."""
    now = timezone.now()
    with transaction.atomic():
        row = _row(name)
        totals = dict(row.totals)
        for key, value in (result or {}).items():
            if isinstance(value, int) and not isinstance(value, bool):
                totals[key] = int(totals.get(key, 0)) + value
        row.totals = totals
        row.runs += 1
        row.last_finished_at = now
        row.last_duration_ms = max(0, int((now - started_at).total_seconds() * 1000))
        row.save()


def job_failed(name: str, *, started_at: datetime, error: BaseException) -> None:
    """One failed run: the exception's type is kept, never its message (it may carry input)."""
    now = timezone.now()
    with transaction.atomic():
        row = _row(name)
        row.failures += 1
        row.last_failed_at = now
        row.last_error = type(error).__name__[:200]
        row.last_duration_ms = max(0, int((now - started_at).total_seconds() * 1000))
        row.save()
