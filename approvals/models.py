"""Human decision queues. A ReconciliationCase is opened for every operation whose
outcome became UNKNOWN; the operation leaves UNKNOWN only when the case is resolved by
a named person with evidence."""

import uuid

from django.db import models
from django.db.models import Q

from ledger.versioning import Versioned


class CaseStatus(models.TextChoices):
    OPEN = "OPEN"
    CLAIMED = "CLAIMED"
    ESCALATED = "ESCALATED"
    RESOLVED = "RESOLVED"


class CaseReason(models.TextChoices):
    LEASE_LOST = "LEASE_LOST"
    LEASE_RELEASED = "LEASE_RELEASED"
    WORKER_REPORTED_UNKNOWN = "WORKER_REPORTED_UNKNOWN"


OPEN_CASE_STATUSES = (CaseStatus.OPEN, CaseStatus.CLAIMED, CaseStatus.ESCALATED)


class ReconciliationCase(Versioned):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("ledger.Tenant", on_delete=models.PROTECT, related_name="cases")
    run = models.ForeignKey("ledger.Run", on_delete=models.PROTECT, related_name="cases")
    operation = models.ForeignKey("ledger.Operation", on_delete=models.PROTECT, related_name="cases")
    attempt = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=CaseStatus.choices, default=CaseStatus.OPEN)
    reason = models.CharField(max_length=32, choices=CaseReason.choices)
    opened_at = models.DateTimeField()
    # Evidence nobody has verified yet, e.g. a provider request id reported by a worker
    # whose token had already been fenced: [{provider_request_id, fencing_token, owner_id, reported_at}].
    unverified_evidence = models.JSONField(default=list)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["operation", "attempt"],
                name="case_one_per_operation_attempt",
            ),
            models.CheckConstraint(condition=Q(status__in=CaseStatus.values), name="case_status_valid"),
        ]
        indexes = [
            models.Index(fields=["tenant", "status", "opened_at"], name="case_queue"),
        ]

    def __str__(self) -> str:
        return f"case {self.id} ({self.status})"
