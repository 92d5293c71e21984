"""Approval requests: asked by the authority checks (``approvals.services.handoff``), decided
by approvers, bound to exactly what they allow (operation, attempt, args digest, fencing
token), used once, voided by a change of lease owner, EXPIRED on timeout — never approved
by a timeout."""

import uuid
from collections.abc import Callable
from datetime import datetime

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.services.handoff import LIVE
from ledger.actors import SYSTEM_APPROVAL_EXPIRY, user_actor
from ledger.boundary import check_text
from ledger.errors import InvalidInput, NotFound, WrongPhase, parse_id
from ledger.models import CapabilityBudget, Operation, Run
from ledger.pagination import past
from ledger.roles import APPROVE
from ledger.services.core.decisions import acting_name
from ledger.services.core.fencing import Fenced, locked_runs, runs_locked_for_sweep
from ledger.services.core.phases import transition
from ledger.services.evidence.append import ChainBatch
from ledger.services.reconciliation.contracts import decision_policy
from ledger.states import ApprovalKind, CapabilityStatus, Phase


def approval_decide(
    *,
    approval_id: object,
    approve: bool,
    reason: str,
    decided_by: str = "",
    user: User | AnonymousUser | None = None,
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
    _refuse_if_expired(approval)
    with transaction.atomic():
        (run,) = locked_runs({"run_id": approval.run_id})
        batch = ChainBatch(timezone.now())
        _decide_pending(approval, approve=approve, decided_by=decided_by, reason=reason.strip(), now=batch.now)
        actor = user_actor(decided_by)
        batch.append(
            run,
            "APPROVAL_APPROVED" if approve else "APPROVAL_DENIED",
            actor=actor,
            fields={
                "approval_id": approval.pk,
                "reason": approval.reason,
                "kind": approval.kind,
                # the policy in force when the person decided
                **decision_policy(run.tenant),
            },
        )
        if not approve and approval.kind == ApprovalKind.OPERATION:
            _deny_waiting_operation(approval=approval, run=run, batch=batch, actor=actor)
        batch.commit()
    return approval


def _refuse_if_expired(approval: ApprovalRequest) -> None:
    """A request past its expiry becomes EXPIRED first (committed, with its event), and the
    decision is refused: WrongPhase, as for one that was EXPIRED already."""
    with transaction.atomic():
        (run,) = locked_runs({"run_id": approval.run_id})
        batch = ChainBatch(timezone.now())
        expired = approval_expire_if_due(approval=approval, run=run, batch=batch)
        if expired:
            batch.commit()
    if expired or approval.status == ApprovalStatus.EXPIRED:
        raise WrongPhase(phase=ApprovalStatus.EXPIRED, wanted=ApprovalStatus.PENDING)


def _decide_pending(approval: ApprovalRequest, *, approve: bool, decided_by: str, reason: str, now: datetime) -> None:
    """PENDING and unexpired -> APPROVED or DENIED by a conditional UPDATE (0 rows: refused
    with the status it has now), and the capability it asked for ACTIVE or DENIED with it.
    ``approval`` is updated in place. The run is locked."""
    target = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
    won = ApprovalRequest.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING, expires_at__gt=now).update(
        status=target, decided_by=decided_by, decided_at=now, reason=reason
    )
    if won != 1:
        approval.refresh_from_db()
        raise WrongPhase(phase=approval.status, wanted=ApprovalStatus.PENDING)
    approval.status, approval.decided_by, approval.decided_at, approval.reason = target, decided_by, now, reason
    if approval.capability_id:
        capability_status = CapabilityStatus.ACTIVE if approve else CapabilityStatus.DENIED
        CapabilityBudget.objects.filter(pk=approval.capability_id, status=CapabilityStatus.PENDING_APPROVAL).update(
            status=capability_status
        )


def approval_expire_if_due(*, approval: ApprovalRequest, run: Run, batch: ChainBatch) -> bool:
    """PENDING or APPROVED past its expiry -> EXPIRED (the run is locked). True if it did."""
    if approval.status not in LIVE or approval.expires_at > batch.now:
        return False
    won = ApprovalRequest.objects.filter(pk=approval.pk, status__in=LIVE, expires_at__lte=batch.now).update(
        status=ApprovalStatus.EXPIRED
    )
    if won:
        approval.status = ApprovalStatus.EXPIRED
        batch.append(run, "APPROVAL_EXPIRED", actor=SYSTEM_APPROVAL_EXPIRY, fields={"approval_id": approval.pk})
    return bool(won)


def approvals_expire(*, batch_size: int | None = None, progress: Callable[[int, int], None] | None = None) -> int:
    """Job: every live approval past its expiry becomes EXPIRED, with an event each. Runs
    are locked first (as every other writer does), skipping runs busy elsewhere; each
    batch then reads its approvals again under those locks (an approval changes only
    under its run's lock) and moves them in one UPDATE.

    When every run of a batch's due approvals is busy (another copy of this job has them,
    ``expire_approvals --processes N``), the next read starts past those approvals, in
    (expires_at, id) order, instead of ending the pass: copies at once split the backlog.
    ``progress(expired, batches)`` is called after each batch that locked runs."""
    batch_size = batch_size or settings.FENCELINE["APPROVAL_EXPIRY_BATCH_SIZE"]
    expired = batches = 0
    after: tuple[datetime, uuid.UUID] | None = None  # (expires_at, id) of the last due approval whose run was busy
    restarted = False
    while True:
        with transaction.atomic():
            now = timezone.now()
            due_now = ApprovalRequest.objects.filter(status__in=LIVE, expires_at__lte=now)
            if after is not None:
                due_now = past(due_now, "expires_at", *after)
            due = list(due_now.order_by("expires_at", "pk").values_list("run_id", "expires_at", "pk")[:batch_size])
            if not due:
                return expired
            runs = {run.pk: run for run in runs_locked_for_sweep(run_ids={row[0] for row in due})}
            batch = ChainBatch(now)
            expired += _expire_due(runs=runs, batch=batch, limit=batch_size)
            batch.commit()
        if runs:
            batches += 1
            if progress is not None:
                progress(expired, batches)
        if len(due) < batch_size:
            if after is None or restarted:
                return expired
            # The end, reached by reading past busy runs: once more from the start, for what
            # the other copy's batches left (a run's approvals past its batch's limit).
            after, restarted = None, True
            continue
        if not runs:  # all busy elsewhere: look past them (the next pass takes what is left)
            after = due[-1][1:]


def _expire_due(*, runs: dict[uuid.UUID, Run], batch: ChainBatch, limit: int) -> int:
    """PENDING or APPROVED past its expiry -> EXPIRED for (at most ``limit``) approvals of
    the locked ``runs``, oldest expiry first, with one APPROVAL_EXPIRED event each."""
    if not runs:
        return 0
    live = ApprovalRequest.objects.filter(run_id__in=list(runs), status__in=LIVE, expires_at__lte=batch.now)
    due = list(live.select_for_update().order_by("expires_at", "pk").values_list("pk", "run_id")[:limit])
    if not due:
        return 0
    won = live.filter(pk__in=[pk for pk, _ in due]).update(status=ApprovalStatus.EXPIRED)
    if won != len(due):  # impossible: the rows are locked
        raise WrongPhase(phase="approval changed concurrently", wanted=ApprovalStatus.PENDING)
    batch.append_many(
        [(runs[run_id], {"approval_id": pk}) for pk, run_id in due], "APPROVAL_EXPIRED", actor=SYSTEM_APPROVAL_EXPIRY
    )
    return won


def _deny_waiting_operation(*, approval: ApprovalRequest, run: Run, batch: ChainBatch, actor: str) -> None:
    """An approver's "no" is the operation's decision: PENDING_APPROVAL -> DENIED."""
    if approval.operation_id is None:
        return  # a capability's approval: the capability itself was denied
    op = Operation.objects.get(pk=approval.operation_id)
    if op.phase != Phase.PENDING_APPROVAL or op.attempt != approval.attempt:
        return
    ctx = Fenced(run=run, batch=batch, now=batch.now, actor=actor, fencing_token=approval.fencing_token)
    transition(
        op,
        Phase.DENIED,
        ctx,
        reason=f"an approver denied it: {approval.reason}",
        decision_code="DENY_POLICY",
        event_fields={"decision": "DENY_POLICY", "approval_id": approval.pk},
    )
