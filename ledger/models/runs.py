"""Runs, their leases (with one history row per fencing token) and their operations."""

import uuid

from django.db import models
from django.db.models import Q
from django.db.models.functions import Upper
from django.utils import timezone

from ledger.chain import GENESIS_HASH
from ledger.models.tenancy import Tenant, Worker
from ledger.states import (
    CANCEL_ENDS,
    INSTANCE_LIVE,
    RUN_FINISHED,
    EffectClass,
    InstanceState,
    LeaseEnd,
    Phase,
    RunStatus,
)
from ledger.versioning import Versioned

# A fencing token is an integer a JavaScript client holds exactly: at most 2**53 - 1. It is
# issued as the fence's generation (ledger/services/fence/generation.py) shifted left by
# FENCE_GENERATION_SHIFT bits, or the run's previous token + 1 when that is larger.
FENCING_TOKEN_MAX = 2**53 - 1
FENCE_GENERATION_SHIFT = 20
FENCE_GENERATION_MAX = FENCING_TOKEN_MAX >> FENCE_GENERATION_SHIFT  # 2**33 - 1: Unix seconds until 2242


# A run with an operation waiting for approval, authorized or dispatched (its counters are
# kept with every transition, under the run's lock): where a tenant's active operations are
# counted, now that the operations table has no index on the phase. Over index
# run_may_be_in_flight, whose condition reads the flag, not these counters (see the field).
RUN_IN_FLIGHT = Q(may_be_in_flight=True) & (Q(n_pending_approval__gt=0) | Q(n_authorized__gt=0) | Q(n_dispatched__gt=0))
# A run with an operation dispatched or UNKNOWN (the UNCERTAIN filter), over index
# run_uncertain: every run that may have one in flight, and those with UNKNOWN operations.
RUN_UNCERTAIN = (Q(may_be_in_flight=True) | Q(n_unknown__gt=0)) & (Q(n_unknown__gt=0) | Q(n_dispatched__gt=0))


class Run(Versioned):
    """One agent task, with the head of its evidence chain and its stale-write count."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Found through run_tenant_recent (tenant, -created_at), not an index of its own.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="runs", db_index=False)
    # A child run (a sub-agent) never holds more authority than its parent granted it.
    parent = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="children")
    external_id = models.CharField(max_length=200, null=True, blank=True)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.ACTIVE)
    created_at = models.DateTimeField(auto_now_add=True)
    last_seq = models.BigIntegerField(default=0)
    last_hash = models.CharField(max_length=71, default=GENESIS_HASH)
    stale_rejections = models.PositiveIntegerField(default=0)
    # The last time the run made progress: any event but a renewal or a refused stale write
    # (an operation transition, a worker's event, a checkpoint). The idle limit counts from it.
    last_progress_at = models.DateTimeField(null=True, blank=True)
    # When the run finished (COMPLETED, CANCELLED or TIMED_OUT).
    completed_at = models.DateTimeField(null=True, blank=True)
    # The maximum runtime: past this the run ends TIMED_OUT (the policy's max_runtime_s,
    # or a lower one asked at creation). Null: no limit.
    deadline_at = models.DateTimeField(null=True, blank=True)
    # A cancellation (or the timeout), while CANCELLING and after: which end it leads to,
    # who asked and why, and until when in-flight effects may still report.
    ending = models.CharField(max_length=16, choices=RunStatus.choices, blank=True, default="")
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.CharField(max_length=250, blank=True, default="")
    cancel_reason = models.CharField(max_length=500, blank=True, default="")
    cancel_grace_until = models.DateTimeField(null=True, blank=True)

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
    # What the run has asked for, ever (any status), kept with the chain head: while a count
    # is 0 the fenced path has nothing of that kind to look up (an authorization's capability,
    # a lease end's resources to hand to the reaper and approvals to void).
    n_capabilities = models.PositiveIntegerField(default=0)
    n_resources = models.PositiveIntegerField(default=0)
    n_approvals = models.PositiveIntegerField(default=0)
    # Open StateConflicts of the run's records: while above zero its fenced calls are
    # refused (409 STATE_CONFLICT), read by the statement that locks the run.
    open_conflicts = models.PositiveIntegerField(default=0)
    # False only once the run has finished with no operation waiting for approval, authorized
    # or dispatched (kept with the chain head; a CHECK holds it). The indexes of runs with work
    # in flight select on this flag instead of the phase counters: an index that reads a
    # column, even only in its condition, makes every change of that column write an entry
    # into every index of the table (not a HOT update), and the counters change with every
    # transition, while this flag changes once, when the run ends. True by default in the
    # database as well, so that a row written by a build that does not know it is counted.
    may_be_in_flight = models.BooleanField(default=True, db_default=True)

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
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="run_status_valid"),
            models.CheckConstraint(
                condition=~Q(status=RunStatus.CANCELLING) | Q(cancel_grace_until__isnull=False, ending__in=CANCEL_ENDS),
                name="run_cancelling_has_grace_and_end",
            ),
            models.CheckConstraint(
                condition=Q(may_be_in_flight=True)
                | Q(status__in=sorted(RUN_FINISHED), n_pending_approval=0, n_authorized=0, n_dispatched=0),
                name="run_in_flight_flagged",
            ),
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
            # Neither condition reads a counter the hot transitions change (their run updates
            # stay HOT); n_unknown changes only when an outcome is UNKNOWN or reconciled.
            models.Index(
                fields=["-created_at", "-id"],
                condition=Q(may_be_in_flight=True) | Q(n_unknown__gt=0),
                name="run_uncertain",
            ),
            # The ACTIVE runs newest first: the runs list's "stuck" filter and the stuck counts
            # (ledger/observability/stuck.py) walk these instead of every run. The condition
            # reads the status only, which changes once or twice in a run's life (the limits'
            # indexes read it already): the head's updates stay HOT.
            models.Index(fields=["-created_at", "-id"], condition=Q(status=RunStatus.ACTIVE), name="run_active_recent"),
            # ... and per tenant, for the stuck counts (dashboard, /metrics): a LIMITed walk of
            # one tenant's ACTIVE runs (4 ms at 1M runs, against 23-79 ms combining the tenant's
            # half a million entries of run_tenant_recent with run_active_recent).
            models.Index(
                fields=["tenant", "-created_at"], condition=Q(status=RunStatus.ACTIVE), name="run_active_tenant"
            ),
            # A tenant's runs that may have operations active (the breaker's THROTTLED count,
            # the resources page): its unfinished runs and the few finished with one still in
            # flight, keyed by the tenant; not its runs with UNKNOWN operations.
            models.Index(fields=["tenant"], condition=Q(may_be_in_flight=True), name="run_may_be_in_flight"),
            # The dashboard's per-tenant figures, read from these small indexes only.
            models.Index(fields=["tenant", "stale_rejections"], condition=Q(stale_rejections__gt=0), name="run_stale"),
            # The limits job: runs past their maximum runtime, cancellations past their grace.
            models.Index(
                fields=["deadline_at"],
                condition=Q(status=RunStatus.ACTIVE, deadline_at__isnull=False),
                name="run_active_deadline",
            ),
            models.Index(
                fields=["cancel_grace_until"], condition=Q(status=RunStatus.CANCELLING), name="run_cancelling_grace"
            ),
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
    # The current instance's RUNNING or IDLE (a copy of its LeaseGrant's state, so that a
    # renewal sees a change without reading the grant); blank while nobody holds the lease.
    instance_state = models.CharField(max_length=16, choices=InstanceState.choices, blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(fencing_token__gte=0), name="lease_token_non_negative"),
            models.CheckConstraint(condition=Q(fencing_token__lte=FENCING_TOKEN_MAX), name="lease_token_js_safe"),
            models.CheckConstraint(
                condition=Q(owner_id__isnull=True) | Q(expires_at__isnull=False, fencing_token__gte=1),
                name="lease_owned_has_expiry_and_token",
            ),
        ]
        indexes = [
            models.Index(fields=["expires_at"], condition=Q(owner_id__isnull=False), name="lease_held_expiry"),
            # The workers page: the leases each worker holds now.
            models.Index(
                fields=["worker", "expires_at"], condition=Q(owner_id__isnull=False), name="lease_held_worker"
            ),
        ]


class FenceGeneration(models.Model):
    """The fence's generation: every token issued from now on is at least ``generation``
    shifted left by ``FENCE_GENERATION_SHIFT`` bits. A restore (``manage.py restore_check``)
    moves it to the Unix second it ran at, past anything the database rolled back could
    have issued. One row (id 1); a database without it is at generation 0.

    ``home`` names the database the row was last written in (``ledger.sql.fence``: the
    cluster's system identifier, the database's OID and this table's OID). A restored image
    carries the home of the database it was dumped from, so until ``restore_check`` moves
    the fence (and the home) every fenced call there is refused: no token of the rolled-back
    database is issued again or accepted in the meantime. '' (no home recorded) is home."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    generation = models.BigIntegerField(default=0)
    started_at = models.DateTimeField(null=True, blank=True)
    started_by = models.CharField(max_length=150, blank=True, default="")
    home = models.CharField(max_length=80, blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(id=1), name="fence_generation_one_row"),
            models.CheckConstraint(
                condition=Q(generation__gte=0, generation__lte=FENCE_GENERATION_MAX), name="fence_generation_in_range"
            ),
        ]

    def __str__(self) -> str:
        return f"fence generation {self.generation}"


class LeaseGrant(Versioned):
    """One ownership generation of a run, as issued with one fencing token: the lifespan
    article's *instance*. ``state`` follows ``ledger.states.INSTANCE_TRANSITIONS``; the
    instance quotas count the grants in ``INSTANCE_LIVE``."""

    # No index of its own: grant_unique_token_per_run and grant_run_worker lead with the run.
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="lease_grants", db_index=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    state = models.CharField(max_length=16, choices=InstanceState.choices, default=InstanceState.RUNNING)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    # What the instance is for (a tool or capability class such as "browser"), for the
    # per-tool quota; blank when the worker did not say.
    tool = models.CharField(max_length=100, blank=True, default="")
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
            models.CheckConstraint(condition=Q(fencing_token__lte=FENCING_TOKEN_MAX), name="grant_token_js_safe"),
            models.CheckConstraint(condition=Q(state__in=InstanceState.values), name="grant_state_valid"),
        ]
        ordering = ["run", "fencing_token"]
        indexes = [
            # The runs search by the start of an owner id: LIKE 'prefix%' needs the pattern
            # operator class (the database's collation is not C).
            models.Index(fields=["owner_id"], name="grant_owner_prefix", opclasses=["varchar_pattern_ops"]),
            # The runs list's worker filter: "did this worker ever hold this run", from the index alone.
            models.Index(fields=["run", "worker"], name="grant_run_worker"),
            # The instance quotas (per tenant, worker and tool) count live instances from these.
            models.Index(fields=["tenant", "tool"], condition=Q(state__in=INSTANCE_LIVE), name="grant_live_tenant"),
            models.Index(fields=["worker"], condition=Q(state__in=INSTANCE_LIVE), name="grant_live_worker"),
            # The workers page: the leases each worker lost.
            models.Index(
                fields=["worker"],
                condition=Q(end_reason__in=[LeaseEnd.EXPIRED, LeaseEnd.REVOKED]),
                name="grant_lost_worker",
            ),
            # The reaper's instance pass.
            models.Index(
                fields=["state_changed_at"],
                condition=Q(state__in=[InstanceState.EXPIRED, InstanceState.REAPING]),
                name="grant_reaping",
            ),
            # /metrics counts the takeovers per tenant: only the takeovers are in it.
            models.Index(fields=["tenant"], condition=Q(previous_owner_id__isnull=False), name="grant_takeover_tenant"),
        ]


class Operation(Versioned):
    """One side effect. Holds a digest of its arguments, never the arguments."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No index of their own: operation_unique_key_per_tenant leads with the tenant,
    # operation_run with the run. No index of the table names the phase (nor anything else a
    # fenced transition changes), so that a phase change is a HOT update: no index entry per
    # transition, with the table's fillfactor (migration 0023) leaving room on the page. A
    # tenant's active operations are counted through its runs (RUN_IN_FLIGHT).
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="operations", db_index=False)
    run = models.ForeignKey(Run, on_delete=models.PROTECT, related_name="operations", db_index=False)
    idempotency_key = models.CharField(max_length=200)
    tool = models.CharField(max_length=100)
    action = models.CharField(max_length=100)
    resource = models.CharField(max_length=500)
    effect_class = models.CharField(max_length=16, choices=EffectClass.choices)
    args_digest = models.CharField(max_length=100, blank=True, default="")
    provider = models.CharField(max_length=100, blank=True, default="")
    # The W3C trace id of the call that recorded the intent ('' when it carried none).
    trace_id = models.CharField(max_length=32, blank=True, default="")
    # The flow-control key the intent names ('' for none): policy keys "key:<flow_key>" and
    # "key:*" limit it (ledger/services/authority/flow.py).
    flow_key = models.CharField(max_length=100, blank=True, default="")
    estimated_cost_cents = models.BigIntegerField(null=True, blank=True)
    phase = models.CharField(max_length=20, choices=Phase.choices, default=Phase.PLANNED)
    attempt = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(default=timezone.now)
    # Recorded at dispatch: who dispatched under which authority.
    dispatched_at = models.DateTimeField(null=True, blank=True)
    fencing_token = models.BigIntegerField(null=True, blank=True)
    dispatch_owner_id = models.CharField(max_length=200, null=True, blank=True)
    policy_version_at_dispatch = models.PositiveIntegerField(null=True, blank=True)
    credential_version_at_dispatch = models.PositiveIntegerField(null=True, blank=True)
    # Recorded with the outcome. Two representations of the provider's record during the
    # operation.provider_ref upgrade (ledger/services/upgrades/provider_ref.py): the old
    # string id (schema_version 1 reads it) and the structured reference {"provider", "id"}
    # (schema_version 2 reads it); both written until the change is contracted.
    provider_request_id = models.CharField(max_length=200, blank=True, default="")
    provider_ref = models.JSONField(null=True, blank=True)
    actual_cost_cents = models.BigIntegerField(null=True, blank=True)
    error_code = models.CharField(max_length=64, blank=True, default="")
    # Authority: what the last decision rested on, re-checked at dispatch.
    payload_bytes = models.PositiveIntegerField(null=True, blank=True)
    # Set by authorize, so not indexed (an index on them would make authorize's update not
    # HOT): the operations under a credential lease or a capability are found through their
    # run (operation_run), which both belong to. Neither is ever deleted.
    credential_lease = models.ForeignKey(
        "CredentialLease", on_delete=models.PROTECT, null=True, blank=True, related_name="operations", db_index=False
    )
    capability = models.ForeignKey(
        "CapabilityBudget", on_delete=models.PROTECT, null=True, blank=True, related_name="operations", db_index=False
    )
    decision_policy_version = models.PositiveIntegerField(null=True, blank=True)
    decision_code = models.CharField(max_length=32, blank=True, default="")
    # How a person resolved an UNKNOWN outcome: HAPPENED, DID_NOT_HAPPEN or COMPENSATED.
    reconciliation = models.CharField(max_length=16, blank=True, default="")
    # The reconciler an UNKNOWN of this operation is looked up with, chosen at intent from
    # the tool contract or the provider (blank: none; its UNKNOWN goes to people).
    reconciler = models.CharField(max_length=100, blank=True, default="")
    # The worker's outcome said it used one of the breaker's fallbacks for this attempt
    # (policy breaker.levers): True / False as reported, null when it said nothing.
    fallback_used = models.BooleanField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "idempotency_key"], name="operation_unique_key_per_tenant"),
            models.CheckConstraint(condition=Q(phase__in=Phase.values), name="operation_phase_valid"),
            models.CheckConstraint(condition=Q(effect_class__in=EffectClass.values), name="operation_class_valid"),
            models.CheckConstraint(
                condition=Q(phase__in=[Phase.PLANNED, Phase.PENDING_APPROVAL, Phase.AUTHORIZED, Phase.DENIED])
                | Q(fencing_token__isnull=False, dispatched_at__isnull=False),
                name="operation_dispatched_has_token",
            ),
        ]
        indexes = [
            models.Index(fields=["run", "created_at"], name="operation_run"),
            models.Index(Upper("tool"), "run", name="operation_tool"),  # runs search by tool
        ]

    def __str__(self) -> str:
        return f"{self.tool}.{self.action} {self.resource} [{self.phase}]"
