"""Retries: the deterministic retry gate of the Side-Effect Class article, and the new
attempt it allows.

The decision is explainable without asking the model: it depends only on the operation's
phase, its side-effect class, its attempt count and the policy's retry budget
(``retry_budget``, ``ledger.policy``): ``automatic_attempts`` before a person must approve,
``max_attempts`` and ``max_cost_cents`` past which a retry is refused outright (403
DENY_BUDGET naming ``retry_budget:attempts`` or ``retry_budget:cents``; a RETRY_REFUSED
event in the chain names the budget too).
"""

from typing import Any

from django.db import transaction
from django.db.models import Case, F, Sum, When
from django.utils import timezone

from ledger.actors import user_actor
from ledger.errors import ApprovalRequired, Denied, DomainError, NotFound, ReconcileFirst, WrongPhase, parse_id
from ledger.models import CostReservation, Operation, Tenant, Worker
from ledger.observability import metrics
from ledger.policy import STARTER_POLICY, retry_budget_of
from ledger.roles import ADMINISTER
from ledger.services.authority.breaker import breaker_allows
from ledger.services.authority.policy import policy_now
from ledger.services.core.decisions import acting_name, admin_action_record, decision_reason
from ledger.services.core.fencing import Fenced, conflicted, decided, fenced, lock
from ledger.services.core.handoff import queues
from ledger.services.core.phases import transition
from ledger.services.delivery.lookup import delivery_refuses_retry
from ledger.services.evidence.append import ChainBatch
from ledger.services.fence.ending import NEW_WORK
from ledger.states import ApprovalKind, EffectClass, Phase, ReservationState

RetryBudget = dict[str, Any]


def operation_retry_decision(op: Operation, *, budget: RetryBudget | None = None) -> tuple[str, str]:
    """Returns ``(decision, reason)`` with decision one of STOP, RETRY, RETRY_SAME_KEY,
    RECONCILE, APPROVAL, under the policy's ``budget`` (None: the starter's, three
    automatic attempts). The budget's caps (``retry_budget_refusal``) are not asked here."""
    automatic = (budget or STARTER_POLICY["retry_budget"])["automatic_attempts"]
    phase = Phase(op.phase)
    if phase == Phase.CONFIRMED:
        return "STOP", "the provider confirmed the effect"
    if phase in (Phase.UNKNOWN, Phase.DISPATCHED):
        return "RECONCILE", f"the operation is {phase}: the effect may have happened"
    if phase == Phase.DENIED:
        return "STOP", "the operation was denied"
    if phase in (Phase.PLANNED, Phase.PENDING_APPROVAL, Phase.AUTHORIZED):
        return "STOP", f"nothing to retry: attempt {op.attempt} has not been dispatched"
    if phase == Phase.RECONCILED and op.reconciliation != "DID_NOT_HAPPEN":
        return "STOP", f"reconciled: the effect {op.reconciliation.lower().replace('_', ' ') or 'was resolved'}"
    # FAILED, or RECONCILED: decide by side-effect class and attempts spent.
    effect = EffectClass(op.effect_class)
    if effect == EffectClass.PURE and op.attempt < automatic:
        return "RETRY", f"PURE operation, attempt {op.attempt} of {automatic}"
    if effect == EffectClass.IDEMPOTENT and op.attempt < automatic:
        return "RETRY_SAME_KEY", f"IDEMPOTENT operation, attempt {op.attempt} of {automatic}"
    if effect == EffectClass.REPLAYABLE:
        return "RECONCILE", "REPLAYABLE operation: check the durable record before repeating"
    if effect in (EffectClass.PURE, EffectClass.IDEMPOTENT):
        return "APPROVAL", f"{automatic} automatic attempts spent"
    return "APPROVAL", f"{effect} operation: repeating needs a human decision"


def attempts_cost_cents(op: Operation) -> int:
    """What ``op``'s attempts have cost so far: the settled actuals, and the estimates still
    reserved or UNKNOWN (a released reservation cost nothing). Read through the unique
    index of (operation, attempt)."""
    total = CostReservation.objects.filter(operation=op).aggregate(
        cents=Sum(
            Case(
                When(state=ReservationState.SETTLED, then=F("actual_cents")),
                When(state__in=(ReservationState.RESERVED, ReservationState.UNKNOWN), then=F("estimated_cents")),
                default=0,
            )
        )
    )["cents"]
    return int(total or 0)


def retry_budget_refusal(op: Operation, budget: RetryBudget) -> Denied | None:
    """The refusal of another attempt of ``op`` past the policy's caps, or None: its
    ``max_attempts`` (the next attempt would be beyond it) or its ``max_cost_cents`` (the
    attempts so far have cost that much). The refusal names the budget."""
    most = budget["max_attempts"]
    if most is not None and op.attempt >= most:
        return Denied(
            "DENY_BUDGET",
            f"the retry budget allows {most} attempt(s) of an operation; attempt {op.attempt} was the last",
            budget="retry_budget:attempts",
        )
    cap = budget["max_cost_cents"]
    if cap is not None:
        spent = attempts_cost_cents(op)
        if spent >= cap:
            return Denied(
                "DENY_BUDGET",
                f"the retry budget allows {cap} cents over an operation's attempts; its {op.attempt} cost {spent}",
                budget="retry_budget:cents",
            )
    return None


def retry_decision_now(op: Operation) -> tuple[str, str]:
    """``GET /operations/{id}/retry-decision``: the decision under the tenant's current
    policy; a retry the budget's caps refuse is STOP, with the budget named in the reason."""
    budget = retry_budget_of(policy_now(tenant=op.tenant).document)
    decision, reason = operation_retry_decision(op, budget=budget)
    if decision in ("RETRY", "RETRY_SAME_KEY", "APPROVAL"):
        refusal = retry_budget_refusal(op, budget)
        if refusal is not None:
            return "STOP", f"{refusal.extra['budget']}: {refusal.detail}"
    return decision, reason


def operation_retry(*, worker: Worker, operation_id: object, fencing_token: int) -> Operation:
    """A new attempt of a FAILED (or reconciled as not happened) operation, as the retry
    decision allows: RETRY / RETRY_SAME_KEY start attempt + 1 (same idempotency key);
    RECONCILE refuses (RECONCILE_FIRST); APPROVAL asks for, or uses, an approval bound to
    this operation, attempt, args digest and fencing token. A NON_RETRYABLE send whose
    delivery is recorded DELIVERED or DEFERRED is refused (ALREADY_DELIVERED). Every refusal
    of the decision (not a stale token, which the fence records) is a RETRY_REFUSED event."""
    op_id = parse_id(operation_id, "operation")
    op = decided(
        fenced(
            worker=worker,
            operation_id=op_id,
            fencing_token=fencing_token,
            attempted="operation.retry",
            write=_retry_write,
            ending=NEW_WORK,
        )
    )
    metrics.RETRY_BY_EFFECT_CLASS.labels(worker.tenant.slug, op.effect_class).inc()
    return op


def _retry_write(ctx: Fenced, *, asked_by: str = "") -> tuple[Operation, DomainError | None]:
    """The retry of ``ctx.operation`` on its locked run, whoever asks (its worker through the
    fence, an admin from the console: ``asked_by`` is then their reason): the decision, its
    refusal recorded (RETRY_REFUSED), the approval asked or used, or the next attempt."""
    op = ctx.operation
    if op is None:
        raise NotFound("operation not found")
    now = policy_now(tenant=ctx.run.tenant, seen=ctx.tenant)
    policy = now.document
    budget = retry_budget_of(policy)
    decision, reason = operation_retry_decision(op, budget=budget)
    refusal = (
        _refusal(op, decision, reason)
        or retry_budget_refusal(op, budget)
        or breaker_allows(tenant=ctx.run.tenant, op=op, policy=policy, attempt_is_retry=True, stored=now.breaker)
    )
    if refusal is not None:
        _record_refusal(op, ctx, decision=decision, refusal=refusal)
        return op, refusal
    if decision == "APPROVAL":
        asked = _approval_asked(op, ctx, policy=policy)
        if asked is not None:
            return op, asked
    _next_attempt(op, ctx, reason=f"{reason}; asked by a person: {asked_by}" if asked_by else reason)
    return op, None


RETRY_ACTION = "operation.retry"


def operation_retry_by_admin(*, user: Any, operation_id: object, reason: object) -> Operation:
    """An admin's retry of an operation from the console: the same decision, refusals,
    approval and new attempt as a worker's retry (:func:`_retry_write`), under the run's lock,
    with the admin as the actor and their reason in the transition, and an AdminAction of
    the tenant. There is no worker here: the new attempt waits PLANNED under the same
    idempotency key for the lease holder (or the next owner) to replay its intent. A
    NON_RETRYABLE operation asks an approver first (ApprovalRequired, 202): once approved,
    the next retry uses it, the admin's or the worker's (bound to the token then current).
    403 without the admin role on the operation's tenant; 404 for an unknown operation."""
    why = decision_reason(reason)
    op_id = parse_id(operation_id, "operation")
    tenant = Tenant.objects.filter(operations__pk=op_id).first()
    if tenant is None:
        raise NotFound("operation not found")
    actor = user_actor(acting_name(user=user, name="", tenant_id=tenant.pk, perm=ADMINISTER))
    with transaction.atomic():
        locked = lock(tenant=tenant, operation_id=op_id)
        now = timezone.now()
        run = locked.run
        ctx = Fenced(
            run=run,
            batch=ChainBatch(now),
            now=now,
            actor=actor,
            fencing_token=run.lease.fencing_token,
            operation=locked.operation,
            tenant=locked.tenant,
        )
        refusal = conflicted(run) or NEW_WORK.before(ctx)
        op = locked.operation
        if refusal is None:
            op, refusal = _retry_write(ctx, asked_by=why)
            if refusal is None or isinstance(refusal, ApprovalRequired):
                admin_action_record(
                    tenant=tenant,
                    actor=actor,
                    action=RETRY_ACTION,
                    subject=str(op_id),
                    reason=why,
                    fields={"run_id": str(run.pk), "attempt": op.attempt, "approval": refusal is not None},
                    now=now,
                )
        ctx.batch.commit()
    if refusal is not None:
        raise refusal
    if op is None:
        raise NotFound("operation not found")
    metrics.RETRY_BY_EFFECT_CLASS.labels(tenant.slug, op.effect_class).inc()
    return op


def _refusal(op: Operation, decision: str, reason: str) -> DomainError | None:
    """The retry decision's own refusal, before the breaker is asked: RECONCILE and STOP
    refuse; a NON_RETRYABLE send the provider reports delivered (or deferred) is refused."""
    if decision == "RECONCILE":
        return ReconcileFirst(reason)
    if decision == "STOP":
        return WrongPhase(phase=op.phase, wanted="FAILED, or RECONCILED as not having happened")
    return delivery_refuses_retry(op)


def _record_refusal(op: Operation, ctx: Fenced, *, decision: str, refusal: DomainError) -> None:
    """A refused retry is an event in the run's chain: RETRY_REFUSED with the code, why, and
    the budget that refused it if one did (the fence commits it, then the refusal is raised)."""
    ctx.batch.append(
        ctx.run,
        "RETRY_REFUSED",
        actor=ctx.actor,
        fields={
            "operation_id": str(op.pk),
            "attempt": op.attempt,
            "effect_class": op.effect_class,
            "decision": decision,
            "code": refusal.code,
            "reason": refusal.detail,
            "budget": str(refusal.extra.get("budget") or ""),
        },
    )


def _approval_asked(op: Operation, ctx: Fenced, *, policy: dict[str, Any]) -> ApprovalRequired | None:
    """For a retry that needs a person: use the approval bound to this operation, attempt,
    args digest and fencing token (None: go on), or ask for one under the ``policy`` in force
    (the refusal naming it)."""
    approval = queues().approval_usable(
        operation=op, kind=ApprovalKind.RETRY, fencing_token=ctx.fencing_token, now=ctx.now
    )
    if approval is None:
        asked = queues().approval_open(
            run=ctx.run,
            kind=ApprovalKind.RETRY,
            fencing_token=ctx.fencing_token,
            ttl_s=policy["approval_ttl_s"],
            batch=ctx.batch,
            actor=ctx.actor,
            operation=op,
        )
        return ApprovalRequired(asked.pk)
    queues().approval_use(approval=approval, run=ctx.run, batch=ctx.batch, actor=ctx.actor)
    return None


def _next_attempt(op: Operation, ctx: Fenced, *, reason: str) -> None:
    """FAILED (or RECONCILED as not having happened) -> PLANNED as attempt + 1, under the same
    idempotency key, with what the last attempt left cleared."""
    transition(
        op,
        Phase.PLANNED,
        ctx,
        reason=f"retry: {reason}",
        attempt=op.attempt + 1,
        dispatched_at=None,
        fencing_token=None,
        dispatch_owner_id=None,
        provider_request_id="",
        actual_cost_cents=None,
        error_code="",
        reconciliation="",
        decision_code="",
        fallback_used=None,
    )
