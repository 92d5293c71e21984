"""The state machines of the ledger, each in one table.

A service changes a state only along an edge listed here, and only with a conditional
UPDATE on the current state; the row count of that UPDATE decides who won.
"""

from django.db import models


class Phase(models.TextChoices):
    PLANNED = "PLANNED"
    PENDING_APPROVAL = "PENDING_APPROVAL"
    AUTHORIZED = "AUTHORIZED"
    DENIED = "DENIED"
    DISPATCHED = "DISPATCHED"
    CONFIRMED = "CONFIRMED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"
    RECONCILED = "RECONCILED"


class EffectClass(models.TextChoices):
    PURE = "PURE"
    IDEMPOTENT = "IDEMPOTENT"
    REPLAYABLE = "REPLAYABLE"
    UNKNOWN = "UNKNOWN"
    NON_RETRYABLE = "NON_RETRYABLE"


class Outcome(models.TextChoices):
    CONFIRMED = "CONFIRMED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"


class WorkerStatus(models.TextChoices):
    ACCEPTING = "ACCEPTING"
    DRAINING = "DRAINING"
    QUIESCED = "QUIESCED"
    STOPPED = "STOPPED"
    QUARANTINED = "QUARANTINED"


class RunStatus(models.TextChoices):
    ACTIVE = "ACTIVE"
    CANCELLING = "CANCELLING"  # cancelled or past its maximum runtime: no new work, in-flight effects may report
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"


# A run ends along one of these edges. CANCELLING leads to the end its cancellation named
# (``Run.ending``): CANCELLED for a person's or a worker's cancel, TIMED_OUT for the
# maximum runtime.
RUN_TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.ACTIVE: frozenset({RunStatus.CANCELLING, RunStatus.COMPLETED}),
    RunStatus.CANCELLING: frozenset({RunStatus.CANCELLED, RunStatus.TIMED_OUT}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
    RunStatus.TIMED_OUT: frozenset(),
}
CANCEL_ENDS = (RunStatus.CANCELLED, RunStatus.TIMED_OUT)
RUN_FINISHED = frozenset({RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.TIMED_OUT})
RUN_ENDING = frozenset({RunStatus.CANCELLING, RunStatus.CANCELLED, RunStatus.TIMED_OUT})


class LeaseEnd(models.TextChoices):
    RELEASED = "RELEASED"
    EXPIRED = "EXPIRED"
    REVOKED = "REVOKED"  # ended by an admin: the worker was quarantined or missed its drain deadline
    CANCELLED = "CANCELLED"  # the run was cancelled or timed out, and its grace period is over


# Operation phase transitions. DISPATCHED has no edge back to PLANNED or AUTHORIZED and
# UNKNOWN leaves only to RECONCILED (invariant 4). FAILED and RECONCILED lead back to
# PLANNED only through an explicit retry, which starts a new attempt.
PHASE_TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.PLANNED: frozenset({Phase.AUTHORIZED, Phase.DENIED, Phase.PENDING_APPROVAL}),
    Phase.PENDING_APPROVAL: frozenset({Phase.AUTHORIZED, Phase.DENIED}),
    Phase.AUTHORIZED: frozenset({Phase.DISPATCHED, Phase.DENIED}),
    Phase.DENIED: frozenset(),
    Phase.DISPATCHED: frozenset({Phase.CONFIRMED, Phase.FAILED, Phase.UNKNOWN}),
    Phase.CONFIRMED: frozenset(),
    Phase.FAILED: frozenset({Phase.PLANNED}),
    Phase.UNKNOWN: frozenset({Phase.RECONCILED}),
    Phase.RECONCILED: frozenset({Phase.PLANNED}),
}

# Phases from which the world may already have changed.
EFFECT_MAY_HAVE_HAPPENED = frozenset({Phase.DISPATCHED, Phase.CONFIRMED, Phase.UNKNOWN, Phase.RECONCILED})

OUTCOME_PHASE = {
    Outcome.CONFIRMED: Phase.CONFIRMED,
    Outcome.FAILED: Phase.FAILED,
    Outcome.UNKNOWN: Phase.UNKNOWN,
}


def sources_of(target: Phase) -> frozenset[Phase]:
    """The phases from which ``target`` may be reached."""
    return frozenset(src for src, targets in PHASE_TRANSITIONS.items() if target in targets)


def can_move(source: str, target: str) -> bool:
    return Phase(target) in PHASE_TRANSITIONS[Phase(source)]


class BreakerState(models.TextChoices):
    NORMAL = "NORMAL"
    THROTTLED = "THROTTLED"
    DEGRADED = "DEGRADED"
    OPEN = "OPEN"
    UNKNOWN = "UNKNOWN"


class CapabilityStatus(models.TextChoices):
    ACTIVE = "ACTIVE"
    PENDING_APPROVAL = "PENDING_APPROVAL"
    DENIED = "DENIED"


class BudgetKind(models.TextChoices):
    RUN = "RUN"
    TENANT = "TENANT"
    PROVIDER = "PROVIDER"
    RETRY = "RETRY"


class ReservationState(models.TextChoices):
    RESERVED = "RESERVED"
    SETTLED = "SETTLED"
    RELEASED = "RELEASED"
    UNKNOWN = "UNKNOWN"


# --- what the fence hands to people (the approvals app owns the queues) ------------------


class CaseReason(models.TextChoices):
    """Why an operation's outcome became UNKNOWN and a reconciliation case was opened."""

    LEASE_LOST = "LEASE_LOST"
    LEASE_RELEASED = "LEASE_RELEASED"
    LEASE_REVOKED = "LEASE_REVOKED"
    RUN_CANCELLED = "RUN_CANCELLED"
    WORKER_REPORTED_UNKNOWN = "WORKER_REPORTED_UNKNOWN"


class ApprovalKind(models.TextChoices):
    OPERATION = "OPERATION"  # a tool the policy always puts before a person
    RETRY = "RETRY"  # another attempt of a NON_RETRYABLE (or spent) operation
    CAPABILITY = "CAPABILITY"  # a capability budget asked with approval "human"


# --- what a run holds (article "Agent Lifespan Management") ------------------------------


class InstanceState(models.TextChoices):
    """One ownership generation of a run (a LeaseGrant), from allocation to verified cleanup."""

    ALLOCATED = "ALLOCATED"
    RUNNING = "RUNNING"
    IDLE = "IDLE"
    DRAINING = "DRAINING"
    CHECKPOINTED = "CHECKPOINTED"
    EXPIRED = "EXPIRED"
    REAPING = "REAPING"
    RELEASED = "RELEASED"


# The article's diagram, plus the edges of a lease given up (released, completed, cancelled)
# rather than lost: straight to RELEASED when the instance holds no open resource, else to
# REAPING, where the reaper closes what is left. RELEASED is reached only once every
# resource of the instance is RELEASED (confirmed by its driver, or marked by an admin).
INSTANCE_TRANSITIONS: dict[InstanceState, frozenset[InstanceState]] = {
    InstanceState.ALLOCATED: frozenset({InstanceState.RUNNING}),
    InstanceState.RUNNING: frozenset(
        {
            InstanceState.IDLE,
            InstanceState.DRAINING,
            InstanceState.EXPIRED,
            InstanceState.REAPING,
            InstanceState.RELEASED,
        }
    ),
    InstanceState.IDLE: frozenset(
        {
            InstanceState.RUNNING,
            InstanceState.DRAINING,
            InstanceState.EXPIRED,
            InstanceState.REAPING,
            InstanceState.RELEASED,
        }
    ),
    InstanceState.DRAINING: frozenset(
        {InstanceState.CHECKPOINTED, InstanceState.EXPIRED, InstanceState.REAPING, InstanceState.RELEASED}
    ),
    InstanceState.CHECKPOINTED: frozenset({InstanceState.EXPIRED, InstanceState.REAPING, InstanceState.RELEASED}),
    InstanceState.EXPIRED: frozenset({InstanceState.REAPING}),
    InstanceState.REAPING: frozenset({InstanceState.RELEASED}),
    InstanceState.RELEASED: frozenset(),
}
# Instances that hold their run's lease: the ones the instance quotas count.
INSTANCE_LIVE = frozenset(
    {
        InstanceState.ALLOCATED,
        InstanceState.RUNNING,
        InstanceState.IDLE,
        InstanceState.DRAINING,
        InstanceState.CHECKPOINTED,
    }
)


def instance_sources(target: InstanceState) -> list[str]:
    """The states from which ``target`` may be reached (for a conditional UPDATE)."""
    return sorted(src.value for src, targets in INSTANCE_TRANSITIONS.items() if target in targets)


class ResourceKind(models.TextChoices):
    BROWSER_SESSION = "browser_session"
    CONNECTION = "connection"
    TEMP_OBJECT = "temp_object"
    SANDBOX = "sandbox"
    FILE = "file"


class ResourceState(models.TextChoices):
    ACTIVE = "ACTIVE"
    RELEASE_REQUESTED = "RELEASE_REQUESTED"
    RELEASING = "RELEASING"  # claimed by one reaper pass until claim_expires_at
    RELEASED = "RELEASED"
    CLEANUP_FAILED = "CLEANUP_FAILED"  # the driver failed; retried with backoff until it confirms


RESOURCE_TRANSITIONS: dict[ResourceState, frozenset[ResourceState]] = {
    ResourceState.ACTIVE: frozenset({ResourceState.RELEASE_REQUESTED}),
    ResourceState.RELEASE_REQUESTED: frozenset({ResourceState.RELEASING, ResourceState.RELEASED}),
    # A claim that expires (its reaper died) is claimed again from RELEASING itself.
    ResourceState.RELEASING: frozenset({ResourceState.RELEASED, ResourceState.CLEANUP_FAILED, ResourceState.RELEASING}),
    ResourceState.CLEANUP_FAILED: frozenset({ResourceState.RELEASING, ResourceState.RELEASED}),
    ResourceState.RELEASED: frozenset(),
}
RESOURCE_OPEN = frozenset(set(ResourceState) - {ResourceState.RELEASED})


def resource_sources(target: ResourceState) -> tuple[ResourceState, ...]:
    """The states from which ``target`` may be reached, in the table's order."""
    return tuple(src for src, targets in RESOURCE_TRANSITIONS.items() if target in targets)


# Waiting for the reaper's next call (RELEASING is claimed again only once its claim expired);
# what a person may mark released.
RESOURCE_CLAIMABLE = tuple(s for s in resource_sources(ResourceState.RELEASING) if s != ResourceState.RELEASING)
RESOURCE_MARKABLE = resource_sources(ResourceState.RELEASED)


class UpgradePhase(models.TextChoices):
    """Where one change of a record's shape stands (the schema-migration article's three
    releases): EXPAND writes both representations and keeps records at the old version;
    MIGRATE writes the new version (still with the old representation beside it) and
    backfills the rest; CONTRACT writes and reads only the new one."""

    EXPAND = "EXPAND"
    MIGRATE = "MIGRATE"
    CONTRACT = "CONTRACT"


class BackfillState(models.TextChoices):
    RUNNING = "RUNNING"
    PAUSING = "PAUSING"  # asked to stop after its current batch
    PAUSED = "PAUSED"
    DONE = "DONE"


class ConflictStatus(models.TextChoices):
    OPEN = "OPEN"
    RESOLVED = "RESOLVED"


class DeliveryState(models.TextChoices):
    """Delivery evidence of an effect (an email, a webhook sent by a worker), apart from its
    execution: the audit-trail article's second state machine. Not the state of Fenceline's
    own notifications (``ledger.models.notifications``)."""

    DEFERRED = "DEFERRED"  # the provider holds it and will try again
    DELIVERED = "DELIVERED"
    BOUNCED = "BOUNCED"


# DEFERRED -> DELIVERED | BOUNCED; DELIVERED and BOUNCED are final. The first record of an
# operation sets any state. A record along no edge (a late DEFERRED after DELIVERED, a
# BOUNCED after DELIVERED) is kept in the history and its event in the chain, and moves nothing.
DELIVERY_TRANSITIONS: dict[DeliveryState, frozenset[DeliveryState]] = {
    DeliveryState.DEFERRED: frozenset({DeliveryState.DELIVERED, DeliveryState.BOUNCED}),
    DeliveryState.DELIVERED: frozenset(),
    DeliveryState.BOUNCED: frozenset(),
}
