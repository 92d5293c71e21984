"""What a run keeps so that it can outlive the worker holding it: progress checkpoints."""

import uuid

from django.db import models
from django.db.models import Q

from ledger.errors import NotFound, parse_id
from ledger.models.runs import Run
from ledger.states import ResourceKind, ResourceState
from ledger.versioning import Versioned


class ProgressCheckpoint(Versioned):
    """Where a run's work stood, saved by its lease owner under the fence; the latest is
    handed to whoever takes the lease next, so a replacement resumes instead of starting
    over. ``state`` passed the secret boundary; the chain records its digest."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="progress_checkpoints")
    seq = models.PositiveIntegerField()  # 1, 2, ... per run
    position = models.CharField(max_length=200)
    state = models.JSONField(default=dict)
    digest = models.CharField(max_length=71)
    fencing_token = models.BigIntegerField()
    owner_id = models.CharField(max_length=200)
    created_at = models.DateTimeField()
    # When retention removed the state of this superseded checkpoint (the diagnostic plane,
    # class checkpoint_state): ``state`` is then {}; the chain keeps its digest.
    state_removed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="progress_checkpoint_unique_seq_per_run"),
            models.CheckConstraint(condition=Q(seq__gte=1), name="progress_checkpoint_seq_positive"),
        ]
        ordering = ["run", "seq"]


class RunResourceQuerySet(models.QuerySet["RunResource"]):
    def of_tenant(self, tenant_id: int, resource_id: object) -> "RunResource":
        """The resource ``resource_id`` of the tenant; NotFound otherwise."""
        resource = self.filter(tenant_id=tenant_id, pk=parse_id(resource_id, "resource")).first()
        if resource is None:
            raise NotFound("resource not found")
        return resource


class RunResource(Versioned):
    """Something a run holds outside Fenceline — a browser session, a connection, a sandbox —
    by reference (``handle``, never a secret), registered by its worker under the fence and
    closed by the resource reaper through the driver of its kind, never by the worker alone.

    One live (unreleased) resource per (provider, handle) across every tenant: a handle live
    in one run cannot be attached by another (article: "Reusing sessions across tenants")."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("ledger.Tenant", on_delete=models.PROTECT, related_name="resources")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="resources")
    instance = models.ForeignKey("ledger.LeaseGrant", on_delete=models.PROTECT, related_name="resources")
    kind = models.CharField(max_length=32, choices=ResourceKind.choices)
    provider = models.CharField(max_length=100)
    handle = models.CharField(max_length=500)
    state = models.CharField(max_length=20, choices=ResourceState.choices, default=ResourceState.ACTIVE)
    created_at = models.DateTimeField()
    # Deadlines: closed once the run made no progress for idle_s, and at expires_at at the latest.
    idle_s = models.PositiveIntegerField(null=True, blank=True)
    expires_at = models.DateTimeField()
    release_requested_at = models.DateTimeField(null=True, blank=True)
    release_reason = models.CharField(max_length=64, blank=True, default="")
    released_at = models.DateTimeField(null=True, blank=True)
    released_by = models.CharField(max_length=250, blank=True, default="")
    # Cleanup: each driver call counts; a failure waits until next_attempt_at (backoff with jitter).
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.CharField(max_length=300, blank=True, default="")
    first_failed_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=64, blank=True, default="")
    claim_expires_at = models.DateTimeField(null=True, blank=True)
    alerted_at = models.DateTimeField(null=True, blank=True)

    objects = RunResourceQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["provider", "handle"],
                condition=~Q(state=ResourceState.RELEASED),
                name="resource_handle_live_once",
            ),
            models.CheckConstraint(condition=Q(kind__in=ResourceKind.values), name="resource_kind_valid"),
            models.CheckConstraint(condition=Q(state__in=ResourceState.values), name="resource_state_valid"),
            models.CheckConstraint(
                condition=~Q(state=ResourceState.RELEASING) | Q(claim_expires_at__isnull=False),
                name="resource_releasing_is_claimed",
            ),
        ]
        indexes = [
            models.Index(fields=["run", "state"], name="resource_run_state"),
            models.Index(fields=["tenant", "state", "created_at"], name="resource_tenant_state"),
            # The reaper's claims: due releases and retries, expired claims, overdue ACTIVE ones.
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(state__in=[ResourceState.RELEASE_REQUESTED, ResourceState.CLEANUP_FAILED]),
                name="resource_due",
            ),
            models.Index(
                fields=["claim_expires_at"], condition=Q(state=ResourceState.RELEASING), name="resource_claimed"
            ),
            models.Index(fields=["expires_at"], condition=Q(state=ResourceState.ACTIVE), name="resource_active_expiry"),
            models.Index(
                fields=["created_at"],
                condition=Q(state=ResourceState.ACTIVE, idle_s__isnull=False),
                name="resource_active_idle",
            ),
        ]


class ResourceAlert(Versioned):
    """A resource whose cleanup keeps failing or is past its deadline, with who owns it —
    stored (shown in the console), logged, and cleared once the resource is RELEASED."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("ledger.Tenant", on_delete=models.PROTECT, related_name="resource_alerts")
    resource = models.OneToOneField(RunResource, on_delete=models.PROTECT, related_name="alert")
    reason = models.CharField(max_length=32)  # "failures" or "deadline"
    raised_at = models.DateTimeField()
    # tenant, run, instance, worker, kind, handle reference, first failure, attempts, last error
    ownership = models.JSONField()
    cleared_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["tenant", "-raised_at"], condition=Q(cleared_at__isnull=True), name="alert_open")
        ]
