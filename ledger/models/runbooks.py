"""Runbooks: a tenant's own guidance for the people working its reconciliation cases, one
per case reason (why the outcome became UNKNOWN) and one per reconciler verdict (what the
provider lookup said), written in Markdown by the tenant's admins and shown, sanitised, on
each case it applies to (``ledger/services/tenancy/runbooks.py``)."""

from django.db import models
from django.db.models import Q

from ledger.models.tenancy import Tenant
from ledger.versioning import Versioned


class RunbookSubject(models.TextChoices):
    REASON = "reason", "case reason"
    VERDICT = "verdict", "reconciler verdict"


class Runbook(Versioned):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="runbooks")
    subject = models.CharField(max_length=16, choices=RunbookSubject.choices)
    # A CaseReason value (subject "reason") or a reconciler Verdict value (subject "verdict").
    name = models.CharField(max_length=32)
    text = models.TextField()  # Markdown as written; rendered and sanitised when shown
    updated_at = models.DateTimeField()
    updated_by = models.CharField(max_length=160)

    class Meta:
        ordering = ["tenant", "subject", "name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "subject", "name"], name="runbook_one_per_subject"),
            models.CheckConstraint(condition=Q(subject__in=RunbookSubject.values), name="runbook_subject_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.subject}:{self.name}"
