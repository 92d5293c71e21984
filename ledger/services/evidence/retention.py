"""Retention of the diagnostic plane (``manage.py retention`` and its beat job).

For each tenant and payload class, the kept payloads created before the tenant's retention
for that class (``planes.retention_days``) lose their bytes, in batches of
FENCELINE["RETENTION_BATCH_SIZE"], each its own transaction (rows another removal holds are
skipped, appends are never waited on: they only add payloads that are not due). A removed
payload keeps its row as the marker the verifier reads as "payload removed by retention";
the chain, which commits to the digest, is untouched. Running it again removes nothing more.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger.models import Tenant
from ledger.services.evidence.planes import PAYLOAD_CLASSES, removal_cutoff
from ledger.sql import evidence as sql_evidence


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
    """Remove (``dry_run``: only count) the bytes of every diagnostic payload past its
    retention. ``progress(due, removed so far)`` after each batch of a tenant and class."""
    now = now or timezone.now()
    size = batch or settings.FENCELINE["RETENTION_BATCH_SIZE"]
    result = RetentionResult()
    for tenant in Tenant.objects.order_by("pk").only("pk", "slug", "retention_days"):
        for klass in PAYLOAD_CLASSES:
            cutoff = removal_cutoff(tenant, klass, now)
            count = sql_evidence.payloads_due_count(tenant_id=tenant.pk, klass=klass, cutoff=cutoff)
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
            step = sql_evidence.payloads_remove(
                tenant_id=tenant_id, klass=due.klass, cutoff=due.cutoff, now=now, batch=size
            )
        removed += step
        if progress is not None and step:
            progress(due, removed)
        if step < size:
            return removed
