"""Human decision queues. A ReconciliationCase is opened for every operation whose
outcome became UNKNOWN; the operation leaves UNKNOWN only when the case is resolved by
a named person with evidence."""

import uuid

from django.db import models
from django.db.models import Q

from ledger.states import ApprovalKind, CaseReason
from ledger.versioning import Versioned


class CaseStatus(models.TextChoices):
    # A reconciler looks the effect up at its provider first; people see the case when it
    # cannot tell (OPEN), or may take it over themselves (claim or resolve).
    LOOKUP = "LOOKUP"
    OPEN = "OPEN"
    CLAIMED = "CLAIMED"
    ESCALATED = "ESCALATED"
    RESOLVED = "RESOLVED"


OPEN_CASE_STATUSES = (CaseStatus.LOOKUP, CaseStatus.OPEN, CaseStatus.CLAIMED, CaseStatus.ESCALATED)
# The people's queue: open cases no reconciler is still looking up.
PEOPLE_CASE_STATUSES = (CaseStatus.OPEN, CaseStatus.CLAIMED, CaseStatus.ESCALATED)


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
    claimed_by = models.CharField(max_length=150, blank=True, default="")
    claimed_at = models.DateTimeField(null=True, blank=True)
    # Who handed the case up, and why (also in the CASE_ESCALATED event).
    escalated_by = models.CharField(max_length=150, blank=True, default="")
    escalation_reason = models.CharField(max_length=500, blank=True, default="")
    # When it was escalated (by a person, or by the case timers' job: escalated_by
    # "system:case-timers"); the webhook's case_escalated notifications are of these.
    escalated_at = models.DateTimeField(null=True, blank=True)
    # What groups similar cases (the queue's case groups): the operation's tool and provider
    # when the case opened, and the verdict of the reconciler's last lookup ("" before any).
    tool = models.CharField(max_length=100, blank=True, default="", db_default="")
    provider = models.CharField(max_length=100, blank=True, default="", db_default="")
    verdict = models.CharField(max_length=16, blank=True, default="", db_default="")
    # HAPPENED (with the provider's request id), DID_NOT_HAPPEN, or COMPENSATED.
    resolution = models.CharField(max_length=16, blank=True, default="")
    resolution_reason = models.CharField(max_length=500, blank=True, default="")
    resolved_by = models.CharField(max_length=150, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    # Provider lookups (approvals/services/lookups.py): the reconciler that looks this
    # effect up (blank: none, the case went straight to people), how many lookups it made,
    # when the next one is due, the claim of the pass doing it, and every lookup's evidence:
    # [{at, reconciler, attempt, verdict, asked, status, answer_digest, why, ...}].
    reconciler = models.CharField(max_length=100, blank=True, default="")
    lookup_attempts = models.PositiveIntegerField(default=0)
    next_lookup_at = models.DateTimeField(null=True, blank=True)
    lookup_claimed_until = models.DateTimeField(null=True, blank=True)
    lookup_history = models.JSONField(default=list, blank=True)

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
            # "Mine": the cases a person holds, oldest first.
            models.Index(
                fields=["claimed_by", "opened_at", "id"], condition=Q(status=CaseStatus.CLAIMED), name="case_claimed_by"
            ),
            # "All": every case, newest first, and "resolved" newest first by when.
            models.Index(fields=["opened_at", "id"], name="case_all_recent"),
            # The queue across a user's tenants, oldest first, and the dashboard's open counts.
            models.Index(
                fields=["opened_at", "id"], condition=Q(status__in=OPEN_CASE_STATUSES), name="case_open_queue"
            ),
            models.Index(fields=["tenant"], condition=Q(status__in=OPEN_CASE_STATUSES), name="case_open_tenant"),
            # The lookup job's claim: due cases, oldest first.
            models.Index(fields=["next_lookup_at"], condition=Q(status=CaseStatus.LOOKUP), name="case_lookup_due"),
            # The case groups: what waits for people, grouped by what makes cases similar,
            # with their age range (an index-only walk, approvals.selectors.case_groups).
            models.Index(
                fields=["tenant", "tool", "provider", "reason", "verdict", "opened_at"],
                condition=Q(status__in=PEOPLE_CASE_STATUSES),
                name="case_group",
            ),
            # The case timers' job: claims oldest first (expiry), ESCALATED ones by when.
            models.Index(fields=["claimed_at"], condition=Q(status=CaseStatus.CLAIMED), name="case_claim_timer"),
            # The dashboard's settled-in-the-last-24-h figures.
            models.Index(
                fields=["tenant", "resolved_at"], condition=Q(status=CaseStatus.RESOLVED), name="case_resolved_recent"
            ),
        ]

    def __str__(self) -> str:
        return f"case {self.id} ({self.status})"


class CaseComment(Versioned):
    """A short note on a case by a person working it (through the secret boundary), shown
    on the case as a thread; each is also a CASE_COMMENTED event in the run's chain."""

    case = models.ForeignKey(ReconciliationCase, on_delete=models.PROTECT, related_name="comments")
    author = models.CharField(max_length=150)
    text = models.CharField(max_length=1000)
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["case", "created_at", "id"]
        indexes = [models.Index(fields=["case", "created_at"], name="case_comment_thread")]

    def __str__(self) -> str:
        return f"{self.author} on {self.case_id}"


class ApprovalStatus(models.TextChoices):
    PENDING = "PENDING"
    APPROVED = "APPROVED"
    DENIED = "DENIED"
    EXPIRED = "EXPIRED"
    USED = "USED"
    VOID = "VOID"


class ApprovalRequest(Versioned):
    """A question for an approver, bound to exactly what it allows: the operation, its
    attempt and args digest, and the fencing token current when it was asked."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("ledger.Tenant", on_delete=models.PROTECT, related_name="approvals")
    run = models.ForeignKey("ledger.Run", on_delete=models.PROTECT, related_name="approvals")
    kind = models.CharField(max_length=16, choices=ApprovalKind.choices)
    operation = models.ForeignKey(
        "ledger.Operation", on_delete=models.PROTECT, null=True, blank=True, related_name="approvals"
    )
    capability = models.ForeignKey(
        "ledger.CapabilityBudget", on_delete=models.PROTECT, null=True, blank=True, related_name="approvals"
    )
    attempt = models.PositiveIntegerField(null=True, blank=True)
    args_digest = models.CharField(max_length=100, blank=True, default="")
    fencing_token = models.BigIntegerField()
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    requested_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    decided_by = models.CharField(max_length=150, blank=True, default="")
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True, default="")
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=ApprovalStatus.values), name="approval_status_valid")
        ]
        indexes = [
            models.Index(fields=["tenant", "status", "expires_at"], name="approval_queue"),
            models.Index(fields=["status", "expires_at", "id"], name="approval_status_queue"),
            # The queue's "all" and "decided" views, in either order (issue 17): a page of
            # them is a walk of one of these, not a sort of every request.
            models.Index(fields=["expires_at", "id"], name="approval_expiring_all"),
            models.Index(fields=["requested_at", "id"], name="approval_asked_all"),
            # The expiry job's walk (issue 16): the live requests in (expires_at, id) order,
            # read a batch at a time from the front, past none of the expired, used or
            # decided ones (its IN (PENDING, APPROVED) cannot walk approval_status_queue in
            # that order).
            models.Index(
                fields=["expires_at", "id"],
                name="approval_live_expiry",
                condition=Q(status__in=[ApprovalStatus.PENDING, ApprovalStatus.APPROVED]),
            ),
        ]
