"""The approvals app's side of ``ledger.services.core.handoff``: the steps the fence and the
authority checks take to put work before a person, and the one read the worker API needs of
the cases. Registered at start-up (``approvals.apps``); each step runs in the caller's
transaction, with the runs locked."""

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from approvals import selectors
from approvals.models import OPEN_CASE_STATUSES, ApprovalRequest, ApprovalStatus, CaseStatus, ReconciliationCase
from ledger.errors import WrongPhase
from ledger.models import CapabilityBudget, Operation, Run
from ledger.services.core.handoff import UnknownTime
from ledger.services.evidence.append import ChainBatch
from ledger.states import ApprovalKind, CaseReason

LIVE = (ApprovalStatus.PENDING, ApprovalStatus.APPROVED)


# --- reconciliation cases -------------------------------------------------------------------


def cases_open(*, operations: Sequence[Operation], reason: CaseReason, now: datetime) -> dict[Any, ReconciliationCase]:
    """One case per (operation, attempt), in one INSERT. Returns {operation_id: case}.

    Called inside the transaction that moves the operations to UNKNOWN, with their runs
    locked, so the cases and the phase change commit together or not at all.
    """
    first_lookup = now + timedelta(seconds=settings.FENCELINE["RECONCILE_AFTER_S"])
    cases = [
        ReconciliationCase(
            tenant_id=op.tenant_id,
            run_id=op.run_id,
            operation=op,
            attempt=op.attempt,
            reason=reason,
            opened_at=now,
            tool=op.tool,
            provider=op.provider or "",
            # An effect with a reconciler is looked up at its provider before people see it.
            status=CaseStatus.LOOKUP if op.reconciler else CaseStatus.OPEN,
            reconciler=op.reconciler,
            next_lookup_at=first_lookup if op.reconciler else None,
        )
        for op in operations
    ]
    ReconciliationCase.objects.bulk_create(cases)
    return {case.operation_id: case for case in cases}


def open_case_for(operation_id: uuid.UUID) -> ReconciliationCase | None:
    return (
        ReconciliationCase.objects.filter(operation_id=operation_id, status__in=OPEN_CASE_STATUSES)
        .order_by("-opened_at")
        .first()
    )


def case_attach_unverified_evidence(*, operation_id: uuid.UUID, evidence: dict[str, Any]) -> Any:
    """Add evidence nobody has verified (for instance a fenced worker's provider request
    id) to the operation's open case; returns the case id, or None when no case is open.
    The caller holds the run lock."""
    case = open_case_for(operation_id)
    if case is None:
        return None
    case.unverified_evidence = [*case.unverified_evidence, evidence]
    ReconciliationCase.objects.filter(pk=case.pk, status__in=OPEN_CASE_STATUSES).update(
        unverified_evidence=case.unverified_evidence
    )
    return case.pk


# --- approval requests ----------------------------------------------------------------------


def approval_open(
    *,
    run: Run,
    kind: ApprovalKind,
    fencing_token: int,
    ttl_s: int,
    batch: ChainBatch,
    actor: str,
    operation: Operation | None = None,
    capability: CapabilityBudget | None = None,
) -> ApprovalRequest:
    """The live request for this exact binding, or a new PENDING one (the run is locked)."""
    binding: dict[str, Any] = {
        "run": run,
        "kind": kind,
        "fencing_token": fencing_token,
        "operation": operation,
        "capability": capability,
        "attempt": operation.attempt if operation else None,
        "args_digest": operation.args_digest if operation else "",
    }
    existing = ApprovalRequest.objects.filter(
        status=ApprovalStatus.PENDING, expires_at__gt=batch.now, **binding
    ).first()
    if existing is not None:
        return existing
    approval = ApprovalRequest.objects.create(
        tenant_id=run.tenant_id, requested_at=batch.now, expires_at=batch.now + timedelta(seconds=ttl_s), **binding
    )
    run.n_approvals += 1  # written with the chain head
    batch.append(
        run,
        "APPROVAL_REQUESTED",
        actor=actor,
        fields={
            "approval_id": approval.pk,
            "kind": kind.value,
            "operation_id": operation.pk if operation else None,
            "capability_id": capability.pk if capability else None,
            "attempt": binding["attempt"],
            "fencing_token": fencing_token,
            "expires_at": approval.expires_at,
        },
    )
    return approval


def approval_usable(
    *, operation: Operation, kind: ApprovalKind, fencing_token: int, now: datetime
) -> ApprovalRequest | None:
    """An APPROVED, unused, unexpired approval bound to this operation's attempt, digest and fencing token."""
    return ApprovalRequest.objects.filter(
        operation=operation,
        kind=kind,
        attempt=operation.attempt,
        args_digest=operation.args_digest,
        fencing_token=fencing_token,
        status=ApprovalStatus.APPROVED,
        expires_at__gt=now,
    ).first()


def approval_use(*, approval: Any, run: Run, batch: ChainBatch, actor: str) -> None:
    """Consume an approval once: APPROVED -> USED, or refuse if someone used it meanwhile."""
    used = ApprovalRequest.objects.filter(pk=approval.pk, status=ApprovalStatus.APPROVED).update(
        status=ApprovalStatus.USED, used_at=batch.now
    )
    if used != 1:
        raise WrongPhase(phase="approval already used", wanted=ApprovalStatus.APPROVED)
    batch.append(run, "APPROVAL_USED", actor=actor, fields={"approval_id": approval.pk})


def approvals_void_for_runs(*, runs: Sequence[Run], batch: ChainBatch, actor: str) -> int:
    """A change of lease owner voids the live approvals asked under the old token."""
    run_by_id = {run.pk: run for run in runs if run.n_approvals}  # a run that never asked has none
    if not run_by_id:
        return 0
    live = list(ApprovalRequest.objects.filter(run_id__in=run_by_id, status__in=LIVE).values_list("pk", "run_id"))
    if not live:
        return 0
    ApprovalRequest.objects.filter(pk__in=[pk for pk, _ in live], status__in=LIVE).update(status=ApprovalStatus.VOID)
    for pk, run_id in live:
        batch.append(
            run_by_id[run_id],
            "APPROVAL_VOIDED",
            actor=actor,
            fields={"approval_id": pk, "reason": "lease owner changed"},
        )
    return len(live)


# --- the read the worker API's answer for a run shows -----------------------------------------


def run_unknown_time(*, run: Run, now: datetime) -> UnknownTime:
    """How long the run's outcomes were (or are) UNKNOWN (``approvals.selectors``)."""
    return selectors.run_unknown_time(run=run, now=now)
