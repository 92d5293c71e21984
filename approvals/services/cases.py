"""Reconciliation cases: opened when an operation's outcome becomes UNKNOWN."""

from datetime import datetime

from approvals.models import (
    OPEN_CASE_STATUSES,
    CaseReason,
    CaseStatus,
    ReconciliationCase,
)
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


RESOLUTIONS = ("HAPPENED", "DID_NOT_HAPPEN", "COMPENSATED")


def case_resolve(
    *,
    case_id: object,
    resolved_by: str,
    resolution: str,
    reason: str,
    provider_request_id: str = "",
    actual_cost_cents: int | None = None,
) -> ReconciliationCase:
    """Close an UNKNOWN outcome with a named person (or reconciler) and evidence: the
    operation moves UNKNOWN -> RECONCILED, the case is RESOLVED, the cost reservation is
    settled (or released when nothing happened), all as events in the run's chain.
    HAPPENED needs the provider's request id; every resolution needs a reason."""
    from django.db import transaction
    from django.utils import timezone

    from ledger.boundary import check_text
    from ledger.models import Operation
    from ledger.services.errors import InvalidInput, NotFound, WrongPhase
    from ledger.services.events import ChainBatch
    from ledger.services.fencing import Fenced, locked_runs
    from ledger.services.operations import transition
    from ledger.states import Phase

    if resolution not in RESOLUTIONS:
        raise InvalidInput(f"resolution must be one of {', '.join(RESOLUTIONS)}")
    if not resolved_by or not reason or not reason.strip():
        raise InvalidInput("a resolution names who made it and why")
    if resolution == "HAPPENED" and not provider_request_id:
        raise InvalidInput("HAPPENED needs the provider's request id as evidence")
    check_text(reason, path="reason")
    if provider_request_id:
        check_text(provider_request_id, path="provider_request_id")
    case = ReconciliationCase.objects.filter(pk=case_id).first()
    if case is None:
        raise NotFound("case not found")
    with transaction.atomic():
        (run,) = locked_runs({"run_id": case.run_id})
        now = timezone.now()
        ctx = Fenced(run=run, batch=ChainBatch(now), now=now, actor=f"user:{resolved_by}", token=run.lease.fencing_token)
        won = ReconciliationCase.objects.filter(pk=case.pk, status__in=OPEN_CASE_STATUSES).update(
            status=CaseStatus.RESOLVED,
            resolution=resolution,
            resolution_reason=reason.strip(),
            resolved_by=resolved_by,
            resolved_at=now,
        )
        if won != 1:
            case.refresh_from_db()
            raise WrongPhase(phase=f"case {case.status}", wanted="an open case")
        op = Operation.objects.get(pk=case.operation_id)
        if op.phase != Phase.UNKNOWN:
            raise WrongPhase(phase=op.phase, wanted=Phase.UNKNOWN)
        transition(
            op,
            Phase.RECONCILED,
            ctx,
            reason=reason.strip(),
            reconciliation=resolution,
            provider_request_id=provider_request_id or op.provider_request_id,
            actual_cost_cents=actual_cost_cents if actual_cost_cents is not None else op.actual_cost_cents,
            event_fields={"case_id": case.pk, "resolution": resolution},
        )
        from ledger.services.costs import cost_resolve

        cost_resolve(
            op=op,
            run=run,
            actual_cents=0 if resolution == "DID_NOT_HAPPEN" else actual_cost_cents,
            batch=ctx.batch,
            actor=ctx.actor,
            now=now,
        )
        ctx.batch.commit()
    case.refresh_from_db()
    return case
