"""Reconciliation cases: opened when an operation's outcome becomes UNKNOWN."""

from datetime import datetime

from approvals.models import OPEN_CASE_STATUSES, CaseReason, ReconciliationCase
from ledger.models import Operation


def cases_open(*, operations: list[Operation], reason: CaseReason, now: datetime) -> dict:
    """One case per (operation, attempt), in one INSERT. Returns {operation_id: case}.

    Called inside the transaction that moves the operations to UNKNOWN, with their runs
    locked, so the cases and the phase change commit together or not at all.
    """
    cases = [
        ReconciliationCase(
            tenant_id=op.tenant_id,
            run_id=op.run_id,
            operation=op,
            attempt=op.attempt,
            reason=reason,
            opened_at=now,
        )
        for op in operations
    ]
    ReconciliationCase.objects.bulk_create(cases)
    return {case.operation_id: case for case in cases}


def open_case_for(operation_id) -> ReconciliationCase | None:
    return (
        ReconciliationCase.objects.filter(operation_id=operation_id, status__in=OPEN_CASE_STATUSES)
        .order_by("-opened_at")
        .first()
    )


def case_attach_unverified_evidence(*, case: ReconciliationCase, evidence: dict) -> None:
    """Add evidence nobody has verified (for instance a fenced worker's provider request
    id) to an open case. The caller holds the run lock."""
    case.unverified_evidence = [*case.unverified_evidence, evidence]
    ReconciliationCase.objects.filter(pk=case.pk, status__in=OPEN_CASE_STATUSES).update(
        unverified_evidence=case.unverified_evidence
    )
