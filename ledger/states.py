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
    COMPLETED = "COMPLETED"


class LeaseEnd(models.TextChoices):
    RELEASED = "RELEASED"
    EXPIRED = "EXPIRED"
    REVOKED = "REVOKED"  # ended by an admin: the worker was quarantined or missed its drain deadline


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
    WORKER_REPORTED_UNKNOWN = "WORKER_REPORTED_UNKNOWN"


class ApprovalKind(models.TextChoices):
    OPERATION = "OPERATION"  # a tool the policy always puts before a person
    RETRY = "RETRY"  # another attempt of a NON_RETRYABLE (or spent) operation
    CAPABILITY = "CAPABILITY"  # a capability budget asked with approval "human"
