"""Approval requests: asked by the authority checks, decided by approvers, bound to exactly
what they allow (operation, attempt, args digest, fencing token), used once, voided by a
change of lease owner, EXPIRED on timeout — never approved by a timeout."""

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalKind, ApprovalRequest, ApprovalStatus
from ledger.boundary import check_text
from ledger.models import CapabilityBudget, Operation, Run
from ledger.roles import APPROVE
from ledger.services.errors import InvalidInput, NotFound, WrongPhase
from ledger.services.events import ChainBatch
from ledger.services.fencing import locked_runs, parse_id
from ledger.services.roles import acting_name
from ledger.states import CapabilityStatus

LIVE = (ApprovalStatus.PENDING, ApprovalStatus.APPROVED)


def approval_open(
    *,
    run: Run,
    kind: ApprovalKind,
    token: int,
    ttl_s: int,
    batch: ChainBatch,
    actor: str,
    operation: Operation | None = None,
    capability: CapabilityBudget | None = None,
) -> ApprovalRequest:
    """The live request for this exact binding, or a new PENDING one (the run is locked)."""
    binding = {
        "run": run,
        "kind": kind,
        "fencing_token": token,
        "operation": operation,
        "capability": capability,
        "attempt": operation.attempt if operation else None,
        "args_digest": operation.args_digest if operation else "",
    }
    existing = ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING, expires_at__gt=batch.now, **binding).first()
    if existing is not None:
        return existing
    approval = ApprovalRequest.objects.create(
        tenant_id=run.tenant_id, requested_at=batch.now, expires_at=batch.now + timedelta(seconds=ttl_s), **binding
    )
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
            "fencing_token": token,
            "expires_at": approval.expires_at,
        },
    )
    return approval


def approval_usable(*, operation: Operation, kind: ApprovalKind, token: int, now: datetime) -> ApprovalRequest | None:
    """An APPROVED, unused, unexpired approval bound to this operation's attempt, digest and token."""
    return ApprovalRequest.objects.filter(
        operation=operation,
        kind=kind,
        attempt=operation.attempt,
        args_digest=operation.args_digest,
        fencing_token=token,
        status=ApprovalStatus.APPROVED,
        expires_at__gt=now,
    ).first()


def approval_use(*, approval: ApprovalRequest, run: Run, batch: ChainBatch, actor: str) -> None:
    """Consume an approval once: APPROVED -> USED, or refuse if someone used it meanwhile."""
    used = ApprovalRequest.objects.filter(pk=approval.pk, status=ApprovalStatus.APPROVED).update(
        status=ApprovalStatus.USED, used_at=batch.now
    )
    if used != 1:
        raise WrongPhase(phase="approval already used", wanted=ApprovalStatus.APPROVED)
    batch.append(run, "APPROVAL_USED", actor=actor, fields={"approval_id": approval.pk})


def approvals_void_for_runs(*, runs: list[Run], batch: ChainBatch, actor: str) -> int:
    """A change of lease owner voids the live approvals asked under the old token."""
    run_by_id = {run.pk: run for run in runs}
    live = list(ApprovalRequest.objects.filter(run_id__in=run_by_id, status__in=LIVE).values_list("pk", "run_id"))
    if not live:
        return 0
    ApprovalRequest.objects.filter(pk__in=[pk for pk, _ in live], status__in=LIVE).update(status=ApprovalStatus.VOID)
    for pk, run_id in live:
        batch.append(run_by_id[run_id], "APPROVAL_VOIDED", actor=actor, fields={"approval_id": pk, "reason": "lease owner changed"})
    return len(live)


def approval_decide(
    *, approval_id: object, approve: bool, reason: str, decided_by: str = "", user=None
) -> ApprovalRequest:
    """An approver's decision: PENDING -> APPROVED or DENIED, with their name and reason, as
    an event in the run's chain. A request past its expiry is marked EXPIRED and the
    decision is refused (WrongPhase): a late "yes" never approves anything. Given a console
    ``user``, their APPROVE role on the request's tenant is checked and their username is
    the actor."""
    if not (decided_by or user is not None) or not reason or not reason.strip():
        raise InvalidInput("a decision names who made it and why")
    check_text(reason, path="reason")
    approval = ApprovalRequest.objects.filter(pk=parse_id(approval_id, "approval")).first()
    if approval is None:
        raise NotFound("approval not found")
    decided_by = acting_name(user=user, name=decided_by, tenant_id=approval.tenant_id, perm=APPROVE)
    with transaction.atomic():
        (run,) = locked_runs({"run_id": approval.run_id})
        now = timezone.now()
        batch = ChainBatch(now)
        actor = f"user:{decided_by}"
        expired = approval_expire_if_due(approval=approval, run=run, batch=batch)
        if expired:
            batch.commit()
    if expired or approval.status == ApprovalStatus.EXPIRED:
        raise WrongPhase(phase=ApprovalStatus.EXPIRED, wanted=ApprovalStatus.PENDING)
    with transaction.atomic():
        (run,) = locked_runs({"run_id": approval.run_id})
        now = timezone.now()
        batch = ChainBatch(now)
        target = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
        won = ApprovalRequest.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING, expires_at__gt=now).update(
            status=target, decided_by=decided_by, decided_at=now, reason=reason.strip()
        )
        if won != 1:
            approval.refresh_from_db()
            raise WrongPhase(phase=approval.status, wanted=ApprovalStatus.PENDING)
        approval.status, approval.decided_by, approval.decided_at, approval.reason = target, decided_by, now, reason.strip()
        if approval.capability_id:
            capability_status = CapabilityStatus.ACTIVE if approve else CapabilityStatus.DENIED
            CapabilityBudget.objects.filter(pk=approval.capability_id, status=CapabilityStatus.PENDING_APPROVAL).update(
                status=capability_status
            )
        batch.append(
            run,
            "APPROVAL_APPROVED" if approve else "APPROVAL_DENIED",
            actor=actor,
            fields={"approval_id": approval.pk, "reason": approval.reason, "kind": approval.kind},
        )
        if not approve and approval.kind == ApprovalKind.OPERATION:
            _deny_waiting_operation(approval=approval, run=run, batch=batch, actor=actor)
        batch.commit()
    return approval


def approval_expire_if_due(*, approval: ApprovalRequest, run: Run, batch: ChainBatch) -> bool:
    """PENDING or APPROVED past its expiry -> EXPIRED (the run is locked). True if it did."""
    if approval.status not in LIVE or approval.expires_at > batch.now:
        return False
    won = ApprovalRequest.objects.filter(pk=approval.pk, status__in=LIVE, expires_at__lte=batch.now).update(
        status=ApprovalStatus.EXPIRED
    )
    if won:
        approval.status = ApprovalStatus.EXPIRED
        batch.append(run, "APPROVAL_EXPIRED", actor="system:approval-expiry", fields={"approval_id": approval.pk})
    return bool(won)


def approvals_expire(*, batch_size: int = 500) -> int:
    """Job: every live approval past its expiry becomes EXPIRED, with an event each. Runs
    are locked first (as every other writer does), skipping runs busy elsewhere."""
    expired = 0
    while True:
        with transaction.atomic():
            now = timezone.now()
            due = list(ApprovalRequest.objects.filter(status__in=LIVE, expires_at__lte=now).order_by("expires_at")[:batch_size])
            if not due:
                return expired
            runs = {run.pk: run for run in locked_runs({"run_id__in": {a.run_id for a in due}}, skip_locked=True)}
            batch = ChainBatch(now)
            for approval in due:
                if approval.run_id in runs:
                    expired += approval_expire_if_due(approval=approval, run=runs[approval.run_id], batch=batch)
            batch.commit()
        if len(due) < batch_size or not runs:
            return expired


def _deny_waiting_operation(*, approval: ApprovalRequest, run: Run, batch: ChainBatch, actor: str) -> None:
    """An approver's "no" is the operation's decision: PENDING_APPROVAL -> DENIED."""
    from ledger.services.fencing import Fenced
    from ledger.services.operations import transition
    from ledger.states import Phase

    op = Operation.objects.get(pk=approval.operation_id)
    if op.phase != Phase.PENDING_APPROVAL or op.attempt != approval.attempt:
        return
    ctx = Fenced(run=run, batch=batch, now=batch.now, actor=actor, token=approval.fencing_token)
    transition(
        op,
        Phase.DENIED,
        ctx,
        reason=f"an approver denied it: {approval.reason}",
        decision_code="DENY_POLICY",
        event_fields={"decision": "DENY_POLICY", "approval_id": approval.pk},
    )

