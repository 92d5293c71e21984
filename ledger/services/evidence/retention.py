"""Retention of the diagnostic plane (``manage.py retention`` and its beat job).

For each tenant and class of the plane (``planes.RETENTION_CLASSES``), what was kept longer
than the tenant's retention for that class (``planes.retention_days``) is removed, in batches of
FENCELINE["RETENTION_BATCH_SIZE"], each its own transaction (rows another removal holds are
skipped, appends are never waited on: they only add items that are not due). A removed
payload keeps its row as the marker the verifier reads as "payload removed by retention";
the chain, which commits to the digest, is untouched; a checkpoint state, boot evidence or
bundle is emptied in place with the moment of its removal (``ledger.sql.retention``).
Running it again removes nothing more.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger.models import Tenant
from ledger.services.evidence.planes import RETENTION_CLASSES, removal_cutoff
from ledger.sql import retention as sql_retention


@dataclass(frozen=True)
class Due:
    """One tenant's payloads of one class past their retention."""

    tenant: str
    klass: str
    cutoff: datetime
    count: int


@dataclass
class RetentionResult:
    removed: int = 0
    due: list[Due] = field(default_factory=list)


def retention_apply(
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    batch: int | None = None,
    progress: Callable[[Due, int], None] | None = None,
) -> RetentionResult:
    """Remove (``dry_run``: only count) everything of the diagnostic plane past its
    retention. ``progress(due, removed so far)`` after each batch of a tenant and class."""
    now = now or timezone.now()
    size = batch or settings.FENCELINE["RETENTION_BATCH_SIZE"]
    result = RetentionResult()
    for tenant in Tenant.objects.order_by("pk").only("pk", "slug", "retention_days"):
        for klass in RETENTION_CLASSES:
            cutoff = removal_cutoff(tenant, klass, now)
            count = sql_retention.due_count(klass=klass, tenant_id=tenant.pk, cutoff=cutoff)
            if not count:
                continue
            due = Due(tenant.slug, klass, cutoff, count)
            result.due.append(due)
            if dry_run:
                continue
            result.removed += _remove(tenant.pk, due, now, size, progress)
    return result


def _remove(tenant_id: int, due: Due, now: datetime, size: int, progress: Callable[[Due, int], None] | None) -> int:
    removed = 0
    while True:
        with transaction.atomic():
            step = sql_retention.remove(klass=due.klass, tenant_id=tenant_id, cutoff=due.cutoff, now=now, batch=size)
        removed += step
        if progress is not None and step:
            progress(due, removed)
        if step < size:
            return removed
