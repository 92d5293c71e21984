"""Tenants, their policy versions and admin decisions, and worker identities."""

from django.db import models
from django.db.models import Q

from ledger.states import (
    BreakerState,
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
    # After a restore (manage.py restore_check) the tenant's workers are admitted read-only:
    # no authorize or dispatch (409 EFFECTS_HELD) until a person allows effects again.
    effects_held = models.BooleanField(default=False)
    effects_held_reason = models.CharField(max_length=500, blank=True, default="")
    # The data planes (docs/architecture.md, Data planes): days a diagnostic payload of each class is kept,
    # {class: days}, over FENCELINE["RETENTION_DAYS"]; and whether the tenant accepts user
    # content (refused otherwise; stored encrypted when accepted).
    retention_days = models.JSONField(default=dict, db_default={}, blank=True)
    user_content_opt_in = models.BooleanField(default=False, db_default=False)

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
    # The process heartbeat (POST /workers/me/heartbeat), apart from any lease: a QUIESCED
    # worker whose heartbeat lapses is STOPPED.
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The latest boot report's phase (PROCESS_UP, READY, EXECUTING; blank before any) and,
    # while a domain failed, the code its lease acquisitions are refused with.
    # RECONCILE_FIRST: the boot was ready but the worker left effects in doubt (admission paused).
    boot_phase = models.CharField(max_length=16, blank=True, default="")
    not_ready_code = models.CharField(max_length=32, blank=True, default="")
    # Stale-token rejections in the current window (policy stale_token_limit): past the
    # limit the worker is told to stop and QUARANTINED.
    stale_window_started_at = models.DateTimeField(null=True, blank=True)
    stale_in_window = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="worker_unique_name_per_tenant"),
            models.CheckConstraint(condition=Q(status__in=WorkerStatus.values), name="worker_status_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.name}"


# A restart episode: consecutive boots of one worker that ended in a crash or never reached
# EXECUTING (the restart article). It begins with the worker's first restart in the run, the
# boot in second place (``episode_boot == 2``): one boot alone is a start, not an episode. The
# workers list, the worker page, the restart budget's count, the metric and the simulator
# count episodes by this one condition.
RESTART_EPISODE_BEGINS = Q(episode_boot=2)


class WorkerBoot(Versioned):
    """One start of a worker process, as it reported it: what it runs (config hash, code and
    schema versions, credential version, pid, host) and its readiness per domain with evidence
    (through the secret boundary). Consecutive boots that end in a crash or never reach
    EXECUTING form a restart episode (``episode_boot``: its place in the episode, 1 first)."""

    worker = models.ForeignKey(Worker, on_delete=models.PROTECT, related_name="boots")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    boot_id = models.CharField(max_length=64)
    reported_at = models.DateTimeField()
    config_hash = models.CharField(max_length=100)
    code_version = models.CharField(max_length=100)
    state_schema_version = models.PositiveIntegerField()
    credential_version = models.PositiveIntegerField(null=True, blank=True)
    pid = models.PositiveIntegerField()
    host = models.CharField(max_length=200)
    readiness = models.JSONField()
    failed_domains = models.JSONField(default=list)
    phase = models.CharField(max_length=16)  # PROCESS_UP, READY, EXECUTING
    episode_boot = models.PositiveIntegerField(default=1)
    delay_s = models.PositiveIntegerField(default=0)
    ended = models.CharField(max_length=8, blank=True, default="")  # "exit" or "crash", told by the next boot
    # The error the process reported failing with ({kind, message, at}; kind "migration"
    # quarantines), and how many effects the worker had left in doubt (DISPATCHED or UNKNOWN).
    error = models.JSONField(null=True, blank=True)
    unknown_left = models.PositiveIntegerField(default=0)
    # When retention removed this superseded boot's evidence (the diagnostic plane, class
    # boot_evidence): each domain's evidence is then {} and the error keeps only its kind.
    evidence_removed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-reported_at"]
        constraints = [models.UniqueConstraint(fields=["worker", "boot_id"], name="boot_unique_id_per_worker")]


class WorkerDrain(Versioned):
    """One drain of a worker, with the drain article's five signals: when it started, its
    deadline, when the worker quiesced, how many effects it left UNKNOWN, and how many claims
    it made during the drain that were refused (new leases, intents, dispatches)."""

    worker = models.ForeignKey(Worker, on_delete=models.PROTECT, related_name="drains")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    started_at = models.DateTimeField()
    deadline_at = models.DateTimeField()
    started_by = models.CharField(max_length=250)
    reason = models.CharField(max_length=500)
    quiesced_at = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # How it ended: "released" (the worker gave everything up), "deadline" (its leases were
    # revoked), "resumed" or "quarantined" (a person's decision cut it short).
    outcome = models.CharField(max_length=16, blank=True, default="")
    unknown_count = models.PositiveIntegerField(default=0)
    # Deliveries of effects the worker dispatched still DEFERRED when it quiesced (its open
    # drain reports them live: ledger.selectors.worker_deliveries_pending).
    deliveries_pending = models.PositiveIntegerField(default=0)
    stale_claim_rejections = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-started_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["worker"], condition=Q(quiesced_at__isnull=True), name="worker_one_open_drain"
            ),
        ]


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


class TokenFailureWindow(Versioned):
    """Failed worker-token authentications from one client address in the current window
    (``ledger/services/fleet/token_failures.py``): one row per address, shared by every
    process, counted by one upsert (``ledger/sql/throttle.py``)."""

    address = models.CharField(primary_key=True, max_length=45)  # an IPv4 or IPv6 address, as text
    window_started_at = models.DateTimeField()
    failures = models.PositiveIntegerField(default=0)
