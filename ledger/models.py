"""Durable records of the ledger. Models hold data and constraints; every change of
state is made by a function in ``ledger/services/``."""

import uuid

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Upper
from django.utils import timezone

from ledger.chain import GENESIS_HASH
from ledger.states import (
    BreakerState,
    BudgetKind,
    CapabilityStatus,
    EffectClass,
    LeaseEnd,
    Phase,
    ReservationState,
    RunStatus,
    WorkerStatus,
)
from ledger.versioning import Versioned


class Tenant(Versioned):
    """Unit of isolation. Roles are django-guardian object permissions on the tenant."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    # The current TenantPolicy version (every change is a new version row).
    policy_version = models.PositiveIntegerField(default=1)
    breaker_state = models.CharField(max_length=16, choices=BreakerState.choices, default=BreakerState.NORMAL)
    breaker_reason = models.CharField(max_length=300, blank=True, default="")
    breaker_changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        permissions = [
            ("operate_tenant", "Claim and resolve reconciliation cases"),
            ("approve_tenant", "Approve or deny approval requests"),
            ("administer_tenant", "Revoke and rotate credentials, change policy, drain workers, grant roles"),
        ]

    def __str__(self) -> str:
        return self.slug


class Worker(Versioned):
    """An agent worker identity. Only the SHA-256 of its bearer token is stored."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="workers")
    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True)
    status = models.CharField(max_length=16, choices=WorkerStatus.choices, default=WorkerStatus.ACCEPTING)
    status_changed_at = models.DateTimeField(auto_now_add=True)
    # Who changed the status last and why (a person's decision, invariant 8), and until
    # when a DRAINING worker may finish its work before its leases are revoked.
    status_changed_by = models.CharField(max_length=150, blank=True, default="")
    status_reason = models.CharField(max_length=500, blank=True, default="")
    drain_deadline = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="worker_unique_name_per_tenant"),
            models.CheckConstraint(condition=Q(status__in=WorkerStatus.values), name="worker_status_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"


class Run(Versioned):
    """One agent task, with the head of its evidence chain and its stale-write count."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="runs")
    # A child run (a sub-agent) never holds more authority than its parent granted it.
    parent = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="children")
    external_id = models.CharField(max_length=200, null=True, blank=True)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seq = models.BigIntegerField(default=0)
    last_hash = models.CharField(max_length=71, default=GENESIS_HASH)
    stale_rejections = models.PositiveIntegerField(default=0)
    completed_at = models.DateTimeField(null=True, blank=True)

    # Operations per phase, kept current by the transitions themselves (same transaction as
    # the chain head), so the certainty and completeness indicators never scan the run.
    n_planned = models.PositiveIntegerField(default=0)
    n_pending_approval = models.PositiveIntegerField(default=0)
    n_authorized = models.PositiveIntegerField(default=0)
    n_denied = models.PositiveIntegerField(default=0)
    n_dispatched = models.PositiveIntegerField(default=0)
    n_confirmed = models.PositiveIntegerField(default=0)
    n_failed = models.PositiveIntegerField(default=0)
    n_unknown = models.PositiveIntegerField(default=0)
    n_reconciled = models.PositiveIntegerField(default=0)

    # Written only by the verifier (ledger.services.verification).
    verified_at = models.DateTimeField(null=True, blank=True)
    verified_head_seq = models.BigIntegerField(null=True, blank=True)
    verified_checkpoint_seq = models.BigIntegerField(null=True, blank=True)
    trusted_seq = models.BigIntegerField(null=True, blank=True)
    trusted_hash = models.CharField(max_length=71, blank=True, default="")
    broken_first_seq = models.BigIntegerField(null=True, blank=True)
    broken_last_seq = models.BigIntegerField(null=True, blank=True)
    broken_reason = models.CharField(max_length=32, blank=True, default="")
    broken_detail = models.CharField(max_length=300, blank=True, default="")
    authorization_mismatches = models.PositiveIntegerField(default=0)
    authorization_detail = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "external_id"],
                condition=Q(external_id__isnull=False),
                name="run_unique_external_id_per_tenant",
            ),
            models.CheckConstraint(condition=Q(last_seq__gte=0), name="run_last_seq_non_negative"),
        ]
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="run_tenant_recent"),
            # The runs list, newest first across a user's tenants, and its rare filters: each
            # walks an index in page order instead of sorting a million rows.
            models.Index(fields=["-created_at", "-id"], name="run_recent"),
            models.Index(fields=["-created_at", "-id"], condition=~Q(broken_reason=""), name="run_broken_recent"),
            models.Index(
                fields=["-created_at", "-id"], condition=Q(authorization_mismatches__gt=0), name="run_mismatch_recent"
            ),
            models.Index(
                fields=["-created_at", "-id"],
                condition=Q(n_unknown__gt=0) | Q(n_dispatched__gt=0),
                name="run_uncertain_recent",
            ),
            # The dashboard's per-tenant figures, read from these small indexes only.
            models.Index(fields=["tenant", "stale_rejections"], condition=Q(stale_rejections__gt=0), name="run_stale"),
            models.Index(
                fields=["tenant", "verified_at"],
                condition=Q(verified_checkpoint_seq__isnull=False),
                name="run_verified",
            ),
        ]

    def __str__(self) -> str:
        return str(self.id)


class RunLease(Versioned):
    """The current ownership of a run. ``fencing_token`` only ever grows; the lease is
    held when ``owner_id`` is set and ``expires_at`` is in the future."""

    run = models.OneToOneField(Run, on_delete=models.PROTECT, primary_key=True, related_name="lease")
    owner_id = models.CharField(max_length=200, null=True, blank=True)
    worker = models.ForeignKey(Worker, on_delete=models.PROTECT, null=True, blank=True, related_name="+")
    fencing_token = models.BigIntegerField(default=0)
    acquired_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_renewed_at = models.DateTimeField(null=True, blank=True)
    # Why the last ownership ended, while nobody owns the lease.
    end_reason = models.CharField(max_length=16, choices=LeaseEnd.choices, null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(fencing_token__gte=0), name="lease_token_non_negative"),
            models.CheckConstraint(
                condition=Q(owner_id__isnull=True) | Q(expires_at__isnull=False, fencing_token__gte=1),
                name="lease_owned_has_expiry_and_token",
            ),
        ]
        indexes = [
            models.Index(fields=["expires_at"], condition=Q(owner_id__isnull=False), name="lease_held_expiry"),
        ]


class LeaseGrant(Versioned):
    """History: one row per ownership change (each issued fencing token)."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="lease_grants")
    fencing_token = models.BigIntegerField()
    owner_id = models.CharField(max_length=200)
    worker = models.ForeignKey(Worker, on_delete=models.PROTECT, related_name="+")
    acquired_at = models.DateTimeField()
    previous_owner_id = models.CharField(max_length=200, null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=16, choices=LeaseEnd.choices, null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "fencing_token"], name="grant_unique_token_per_run"),
            models.CheckConstraint(condition=Q(fencing_token__gte=1), name="grant_token_positive"),
        ]
        ordering = ["run", "fencing_token"]
        indexes = [models.Index(fields=["owner_id"], name="grant_owner")]  # runs search by owner id


class Operation(Versioned):
    """One side effect. Holds a digest of its arguments, never the arguments."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="operations")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="operations")
    idempotency_key = models.CharField(max_length=200)
    tool = models.CharField(max_length=100)
    action = models.CharField(max_length=100)
    resource = models.CharField(max_length=500)
    effect_class = models.CharField(max_length=16, choices=EffectClass.choices)
    args_digest = models.CharField(max_length=100, blank=True, default="")
    provider = models.CharField(max_length=100, blank=True, default="")
    estimated_cost_cents = models.BigIntegerField(null=True, blank=True)
    phase = models.CharField(max_length=20, choices=Phase.choices, default=Phase.PLANNED)
    attempt = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(default=timezone.now)
    # Recorded at dispatch: who dispatched under which authority.
    dispatched_at = models.DateTimeField(null=True, blank=True)
    dispatch_token = models.BigIntegerField(null=True, blank=True)
    dispatch_owner_id = models.CharField(max_length=200, null=True, blank=True)
    policy_version_at_dispatch = models.PositiveIntegerField(null=True, blank=True)
    credential_version_at_dispatch = models.PositiveIntegerField(null=True, blank=True)
    # Recorded with the outcome.
    provider_request_id = models.CharField(max_length=200, blank=True, default="")
    actual_cost_cents = models.BigIntegerField(null=True, blank=True)
    error_code = models.CharField(max_length=64, blank=True, default="")
    # Authority: what the last decision rested on, re-checked at dispatch.
    payload_bytes = models.PositiveIntegerField(null=True, blank=True)
    credential_lease = models.ForeignKey(
        "CredentialLease", on_delete=models.PROTECT, null=True, blank=True, related_name="operations"
    )
    capability = models.ForeignKey(
        "CapabilityBudget", on_delete=models.PROTECT, null=True, blank=True, related_name="operations"
    )
    decision_policy_version = models.PositiveIntegerField(null=True, blank=True)
    decision_code = models.CharField(max_length=32, blank=True, default="")
    # How a person resolved an UNKNOWN outcome: HAPPENED, DID_NOT_HAPPEN or COMPENSATED.
    reconciliation = models.CharField(max_length=16, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "idempotency_key"], name="operation_unique_key_per_tenant"),
            models.CheckConstraint(condition=Q(phase__in=Phase.values), name="operation_phase_valid"),
            models.CheckConstraint(condition=Q(effect_class__in=EffectClass.values), name="operation_class_valid"),
            models.CheckConstraint(
                condition=Q(phase__in=[Phase.PLANNED, Phase.PENDING_APPROVAL, Phase.AUTHORIZED, Phase.DENIED])
                | Q(dispatch_token__isnull=False, dispatched_at__isnull=False),
                name="operation_dispatched_has_token",
            ),
        ]
        indexes = [
            models.Index(fields=["run", "phase"], name="operation_run_phase"),
            models.Index(fields=["tenant", "phase"], name="operation_tenant_phase"),
            models.Index(Upper("tool"), "run", name="operation_tool"),  # runs search by tool
        ]

    def __str__(self) -> str:
        return f"{self.tool}.{self.action} {self.resource} [{self.phase}]"


class Event(Versioned):
    """One entry of a run's hash chain. Appended, never updated or deleted."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="events")
    seq = models.BigIntegerField()
    event_id = models.UUIDField(unique=True, default=uuid.uuid4, editable=False)
    type = models.CharField(max_length=64)
    actor = models.CharField(max_length=300)
    occurred_at = models.DateTimeField()
    fields = models.JSONField(default=dict)
    prev_hash = models.CharField(max_length=71)
    hash = models.CharField(max_length=71)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="event_unique_seq_per_run"),
            models.CheckConstraint(condition=Q(seq__gte=1), name="event_seq_positive"),
        ]
        ordering = ["run", "seq"]
        # A run page's stale-write refusals without reading the rest of a long chain.
        indexes = [
            models.Index(fields=["run", "seq"], condition=Q(type="STALE_TOKEN_REJECTED"), name="event_stale_refusals")
        ]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.type}"


class Checkpoint(Versioned):
    """A signed statement by the verifier: the chain of ``run`` up to ``seq`` ends in
    ``last_hash``. Written only by the verifier; never reachable from the worker API."""

    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="checkpoints")
    seq = models.BigIntegerField()
    last_hash = models.CharField(max_length=71)
    verifier_version = models.CharField(max_length=16)
    key_id = models.CharField(max_length=64)
    mac = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="checkpoint_unique_seq_per_run"),
            models.CheckConstraint(condition=Q(seq__gte=1), name="checkpoint_seq_positive"),
        ]
        ordering = ["run", "seq"]


class TenantPolicy(Versioned):
    """One version of a tenant's policy. Never changed: a change is a new version."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="policies")
    version = models.PositiveIntegerField()
    document = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=150)
    reason = models.CharField(max_length=500)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "version"], name="policy_unique_version")]
        ordering = ["tenant", "version"]


class AdminAction(Versioned):
    """A person's decision about a tenant as a whole (a role granted, a policy changed, a
    worker drained, a credential rotated), with their name and reason. Decisions that
    touch runs are also events in those runs' chains; this is the tenant's own record."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="admin_actions")
    occurred_at = models.DateTimeField()
    actor = models.CharField(max_length=160)
    action = models.CharField(max_length=40)
    subject = models.CharField(max_length=300)
    reason = models.CharField(max_length=500)
    fields = models.JSONField(default=dict)

    class Meta:
        indexes = [models.Index(fields=["tenant", "-occurred_at"], name="adminaction_recent")]


class Credential(Versioned):
    """A principal whose secret lives elsewhere: only a reference and its version are kept."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="credentials")
    principal = models.CharField(max_length=200)
    version = models.PositiveIntegerField(default=1)
    secret_ref = models.CharField(max_length=300)
    created_at = models.DateTimeField(auto_now_add=True)
    rotated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "principal"], name="credential_unique_principal")]


class CredentialLease(Versioned):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="credential_leases")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="credential_leases")
    credential = models.ForeignKey(Credential, on_delete=models.PROTECT, related_name="leases")
    version = models.PositiveIntegerField()
    actions = models.JSONField()
    resources = models.JSONField()
    issued_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    revoked_by = models.CharField(max_length=150, blank=True, default="")
    revoke_reason = models.CharField(max_length=500, blank=True, default="")
    # Not a column: ACTIVE, EXPIRED or REVOKED at the time of a read, set on the leases the
    # console's selectors return (ledger.admin_selectors.lease_state) for its templates.
    state: str

    class Meta:
        indexes = [models.Index(fields=["tenant", "revoked_at", "expires_at"], name="credlease_active")]


class CapabilityBudget(Versioned):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="capabilities")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="capabilities")
    tool = models.CharField(max_length=100)
    actions = models.JSONField()
    resources = models.JSONField()
    max_calls = models.PositiveIntegerField()
    used_calls = models.PositiveIntegerField(default=0)
    max_bytes = models.BigIntegerField(null=True, blank=True)
    used_bytes = models.BigIntegerField(default=0)
    expires_at = models.DateTimeField()
    approval = models.CharField(max_length=8)
    status = models.CharField(max_length=20, choices=CapabilityStatus.choices)
    policy_version = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(used_calls__lte=F("max_calls")), name="capability_calls_within_limit"),
            models.CheckConstraint(
                condition=Q(max_bytes__isnull=True) | Q(used_bytes__lte=F("max_bytes")),
                name="capability_bytes_within_limit",
            ),
        ]
        indexes = [models.Index(fields=["run", "tool"], name="capability_run_tool")]


class CostWindow(Versioned):
    """Spend of one budget key in one time window. The check constraint is invariant 7."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="cost_windows")
    kind = models.CharField(max_length=16, choices=BudgetKind.choices)
    key = models.CharField(max_length=200)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    limit_cents = models.BigIntegerField()
    reserved_cents = models.BigIntegerField(default=0)
    settled_cents = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "kind", "key", "starts_at"], name="costwindow_unique"),
            models.CheckConstraint(
                condition=Q(reserved_cents__gte=0, settled_cents__gte=0)
                & Q(limit_cents__gte=F("reserved_cents") + F("settled_cents")),
                name="costwindow_within_limit",
            ),
        ]


class CostReservation(Versioned):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="cost_reservations")
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="cost_reservations")
    operation = models.ForeignKey(Operation, on_delete=models.PROTECT, related_name="cost_reservations")
    attempt = models.PositiveIntegerField()
    provider = models.CharField(max_length=100, blank=True, default="")
    estimated_cents = models.BigIntegerField()
    actual_cents = models.BigIntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=ReservationState.choices, default=ReservationState.RESERVED)
    windows = models.ManyToManyField(CostWindow, related_name="reservations")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation", "attempt"], name="reservation_one_per_attempt"),
        ]
        indexes = [models.Index(fields=["state", "expires_at"], name="reservation_open")]
