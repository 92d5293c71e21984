"""Operation services: intent, authorize and dispatch.

Every phase change is a conditional UPDATE on the operation's current phase, made under
the fence (run and lease rows locked), and appends exactly one event to the run's chain
(``ledger.services.core.phases.transition``). Outcomes are in ``outcomes.py``, retries in
``retry.py``, the move to UNKNOWN in ``unknown.py``.
"""

import uuid
from dataclasses import asdict, dataclass
from typing import Any

from django.db import IntegrityError

from ledger.boundary import check_fields
from ledger.errors import ApprovalRequired, Denied, DomainError, IdempotencyMismatch, NotFound, WrongPhase, parse_id
from ledger.models import Operation, Run, Tenant, Worker
from ledger.observability import metrics
from ledger.observability.tracing import current_trace_id
from ledger.services.authority import evaluation, flow
from ledger.services.authority.breaker import Levers, breaker_after_dispatch, breaker_levers
from ledger.services.core.fencing import Fenced, decided, effects_held, fenced, worker_refused
from ledger.services.core.handoff import queues
from ledger.services.core.intent import Intent
from ledger.services.core.phases import transition
from ledger.services.fence.ending import NEW_WORK
from ledger.services.reconciliation.contracts import decision_policy, intent_terms
from ledger.services.upgrades import provider_ref
from ledger.services.upgrades.phases import phase as upgrade_phase
from ledger.states import ApprovalKind, EffectClass, Phase, WorkerStatus

# The operation's unique key within its tenant (the constraint operation_unique_key_per_tenant).
KEY_PER_TENANT = ("tenant", "idempotency_key")

# The parameters that identify an intent. The fencing token is deliberately not one of
# them: a new owner replaying the same intent gets the same operation.
INTENT_PARAMETERS = (
    "run_id",
    "tool",
    "action",
    "resource",
    "effect_class",
    "args_digest",
    "provider",
    "estimated_cost_cents",
    "payload_bytes",
    "flow_key",
)


def operation_intend(*, worker: Worker, run_id: object, fencing_token: int, intent: Intent) -> tuple[Operation, bool]:
    """Record the intent to perform a side effect. Idempotent per (tenant, key):
    returns ``(operation, created)``; the same key with other parameters is refused. Its
    side-effect class, provider, worst-case cost and reconciler come from the tenant's tool
    contract; a declared class that differs is refused (EFFECT_CLASS_MISMATCH)."""
    if worker.status == WorkerStatus.DRAINING:  # other statuses hold no lease: the fence answers
        raise worker_refused(worker, "records no new intent")
    check_fields(asdict(intent))  # every parameter is stored, not all of them in the event
    declared = intent

    def write(ctx: Fenced) -> tuple[Operation, bool]:
        # After the fence: an unknown run is 404 and a stale token 409 before any contract.
        intent, reconciler = intent_terms(tenant=worker.tenant, intent=declared)
        op = _planned(intent, reconciler=reconciler, tenant=worker.tenant, ctx=ctx)
        mark = ctx.batch.mark()
        ctx.batch.count_move(ctx.run, None, Phase.PLANNED)
        ctx.batch.append(ctx.run, "OPERATION_PLANNED", actor=ctx.actor, fields=_planned_fields(op, ctx))
        # One statement: the insert with its event and the run head, or nothing at all when
        # the tenant's key is taken (by this intent before, or by another run at this
        # moment), which is then a replay.
        if not ctx.batch.commit_inserting(op, conflict=KEY_PER_TENANT, mark=mark):
            existing = Operation.objects.filter(tenant=worker.tenant, idempotency_key=intent.idempotency_key).first()
            if existing is None:
                raise IntegrityError(f"operation {op.pk} was not inserted and its key is not taken")
            return _replay(existing, ctx.run, intent, tenant=worker.tenant.slug), False
        return op, True

    return fenced(
        worker=worker,
        run_id=run_id,
        fencing_token=fencing_token,
        attempted="operation.intend",
        write=write,
        ending=NEW_WORK,
    )


def _planned(intent: Intent, *, reconciler: str, tenant: Tenant, ctx: Fenced) -> Operation:
    """The new operation of ``intent`` (as its tool contract has completed it), PLANNED on
    the fenced run; not inserted yet."""
    return Operation(
        tenant=tenant,
        run=ctx.run,
        idempotency_key=intent.idempotency_key,
        tool=intent.tool,
        action=intent.action,
        resource=intent.resource,
        effect_class=EffectClass(str(intent.effect_class)),  # set once the contract has spoken
        args_digest=intent.args_digest,
        provider=intent.provider,
        estimated_cost_cents=intent.estimated_cost_cents,
        payload_bytes=intent.payload_bytes,
        reconciler=reconciler,
        trace_id=current_trace_id(),
        flow_key=intent.flow_key,
        phase=Phase.PLANNED,
        updated_at=ctx.now,
        schema_version=provider_ref.version_for_new(upgrade_phase(provider_ref.CHANGE)),
    )


def _planned_fields(op: Operation, ctx: Fenced) -> dict[str, Any]:
    """The fields of a new operation's OPERATION_PLANNED event."""
    return {
        "operation_id": op.pk,
        "to": Phase.PLANNED.value,
        "attempt": op.attempt,
        "tool": op.tool,
        "action": op.action,
        "resource": op.resource,
        "effect_class": op.effect_class,
        "idempotency_key": op.idempotency_key,
        "args_digest": op.args_digest,
        "fencing_token": ctx.fencing_token,
        **({"provider": op.provider} if op.provider else {}),
        **({"reconciler": op.reconciler} if op.reconciler else {}),
        **({"flow_key": op.flow_key} if op.flow_key else {}),
    }


def _replay(existing: Operation, run: Run, intent: Intent, *, tenant: str) -> Operation:
    wanted = {"run_id": run.pk, **{k: getattr(intent, k) for k in INTENT_PARAMETERS if k != "run_id"}}
    differing = [k for k in INTENT_PARAMETERS if getattr(existing, k) != wanted[k]]
    metrics.count(metrics.DUPLICATE_REJECTIONS.labels(tenant, "mismatch" if differing else "replay").inc)
    if differing:
        raise IdempotencyMismatch(
            "idempotency_key is already used by an operation with a different " + ", ".join(differing),
            differing=differing,
        )
    return existing


def _locked_operation(ctx: Fenced) -> Operation:
    """The operation ``fenced`` found the run through, read under the run's lock with its
    credential lease."""
    if ctx.operation is None:
        raise NotFound("operation not found")
    return ctx.operation


def _digest_field(ctx: Fenced, version: object) -> dict[str, Any]:
    """The digest of the policy version a decision was made under (none for a refusal made
    before a policy was read)."""
    if not isinstance(version, int):
        return {}
    return decision_policy(ctx.run.tenant, version)


def _deny(op: Operation, ctx: Fenced, denial: Denied) -> Denied:
    """Record a refusal as the operation's own transition: a later decision is a new event."""
    transition(
        op,
        Phase.DENIED,
        ctx,
        reason=denial.detail,
        decision_code=denial.code,
        decision_policy_version=denial.extra.get("policy_version"),
        event_fields={
            "decision": denial.code,
            **_digest_field(ctx, denial.extra.get("policy_version")),
            **({"budget": denial.extra["budget"]} if "budget" in denial.extra else {}),
        },
    )
    return denial


def operation_authorize(
    *, worker: Worker, operation_id: object, fencing_token: int, credential_lease_id: object = None
) -> Operation:
    """Decide an operation: ALLOW (AUTHORIZED), APPROVAL_REQUIRED (PENDING_APPROVAL, raises
    ApprovalRequired) or DENY_* (DENIED, raises Denied). See ledger.services.authority.evaluation."""
    op_id = parse_id(operation_id, "operation")

    def write(ctx: Fenced) -> tuple[Operation, DomainError | None]:
        effects_held(ctx)
        op = _locked_operation(ctx)
        if op.phase == Phase.AUTHORIZED:
            return op, None  # already decided; dispatch checks it all again
        if op.phase not in (Phase.PLANNED, Phase.PENDING_APPROVAL):
            raise WrongPhase(phase=op.phase, wanted="PLANNED or PENDING_APPROVAL")
        try:
            grounds = evaluation.evaluate(op=op, ctx=ctx, lease_id=credential_lease_id)
        except Denied as denial:
            return op, _deny(op, ctx, denial)
        if grounds.needs_approval:
            return op, _ask_approval(op, ctx, grounds)
        _allow(op, ctx, grounds)
        return op, None

    return decided(
        fenced(
            worker=worker,
            operation_id=op_id,
            fencing_token=fencing_token,
            attempted="operation.authorize",
            write=write,
            ending=NEW_WORK,
            capabilities=True,
        )
    )


def _ask_approval(op: Operation, ctx: Fenced, grounds: evaluation.Grounds) -> ApprovalRequired:
    """The refusal of an operation that waits for a person, naming the approval it waits for
    (a capability's still pending, else this operation's live request, asked now if there is
    none); the operation moves to PENDING_APPROVAL the first time."""
    approval = grounds.waiting_for or queues().approval_open(
        run=ctx.run,
        kind=ApprovalKind.OPERATION,
        fencing_token=ctx.fencing_token,
        ttl_s=grounds.policy["approval_ttl_s"],
        batch=ctx.batch,
        actor=ctx.actor,
        operation=op,
    )
    if op.phase == Phase.PLANNED:
        transition(
            op,
            Phase.PENDING_APPROVAL,
            ctx,
            reason="a person must approve",
            decision_policy_version=grounds.policy_version,  # the policy the approver decides under
            event_fields={"approval_id": approval.pk, **_digest_field(ctx, grounds.policy_version)},
        )
    return ApprovalRequired(approval.pk)


def _allow(op: Operation, ctx: Fenced, grounds: evaluation.Grounds) -> None:
    """ALLOW: the move to AUTHORIZED, naming the credential lease and capability it rests on."""
    transition(
        op,
        Phase.AUTHORIZED,
        ctx,
        reason="allowed",
        credential_lease=grounds.lease,
        capability=grounds.capability,
        decision_code="ALLOW",
        decision_policy_version=grounds.policy_version,
        event_fields={
            "policy_version": grounds.policy_version,
            **_digest_field(ctx, grounds.policy_version),
            "credential_lease_id": grounds.lease.pk if grounds.lease else None,
            "capability_id": grounds.capability.pk if grounds.capability else None,
        },
    )


@dataclass(frozen=True)
class Dispatched:
    """What a dispatch hands the worker: the operation, the cost reservation it made for this
    attempt (None: nothing was reserved), and the breaker's levers while it is THROTTLED or
    DEGRADED (policy ``breaker.levers``; None otherwise)."""

    operation: Operation
    reservation_id: uuid.UUID | None = None
    levers: Levers | None = None


def operation_dispatch(*, worker: Worker, operation_id: object, fencing_token: int) -> Operation:
    """:func:`operation_dispatch_terms`, answering the operation only."""
    return operation_dispatch_terms(worker=worker, operation_id=operation_id, fencing_token=fencing_token).operation


def operation_dispatch_terms(*, worker: Worker, operation_id: object, fencing_token: int) -> Dispatched:
    """AUTHORIZED -> DISPATCHED after every authorize check passes again under the current
    policy and the reservations hold. Only after this succeeds may the worker call the
    provider. A refusal moves the operation to DENIED (and reserves nothing); a flow limit
    without room (409 THROTTLED, ``ledger.services.authority.flow``) records nothing and
    leaves it AUTHORIZED, to be dispatched again after ``retry_after_s``. A DRAINING
    worker dispatches nothing new (409 WORKER_DRAINING): the operation stays AUTHORIZED for
    the replacement, under the same idempotency key. Answers the reservation made and the
    breaker's levers as the reservation left the breaker."""
    if worker.status == WorkerStatus.DRAINING:
        raise worker_refused(worker, "dispatches nothing new")
    op_id = parse_id(operation_id, "operation")
    terms: list[Dispatched] = []

    def write(ctx: Fenced) -> tuple[Operation, DomainError | None]:
        effects_held(ctx)
        op = _locked_operation(ctx)
        if op.phase != Phase.AUTHORIZED:
            raise WrongPhase(phase=op.phase, wanted=Phase.AUTHORIZED)
        try:
            terms.append(_dispatch(op, ctx))
        except Denied as denial:
            op.refresh_from_db()
            return op, _deny(op, ctx, denial)
        return op, None

    op = decided(
        fenced(
            worker=worker,
            operation_id=op_id,
            fencing_token=fencing_token,
            attempted="operation.dispatch",
            write=write,
            ending=NEW_WORK,
            capabilities=True,
        )
    )
    return terms[-1] if terms else Dispatched(op)


def _dispatch(op: Operation, ctx: Fenced) -> Dispatched:
    """Under the fence: the checks again, the reservations, the flow limits, the move to
    DISPATCHED; then the terms the worker is handed."""
    grounds = evaluation.evaluate(op=op, ctx=ctx, at_dispatch=True)  # reads only
    if grounds.needs_approval:
        raise Denied("DENY_POLICY", "the approval this operation needs is missing, used, expired or void")
    # All or nothing: a refusal while reserving leaves nothing reserved.
    reservation = evaluation.reserve(op=op, ctx=ctx, grounds=grounds)
    # Flow control: THROTTLED rolls this transaction back (the reservation too) and
    # leaves the operation AUTHORIZED, to be dispatched again later.
    flow.flow_take(op=op, tenant=ctx.run.tenant, policy=grounds.policy, now=ctx.now)
    transition(
        op,
        Phase.DISPATCHED,
        ctx,
        dispatched_at=ctx.now,
        fencing_token=ctx.fencing_token,
        dispatch_owner_id=ctx.lease.owner_id,
        policy_version_at_dispatch=grounds.policy_version,
        credential_version_at_dispatch=grounds.lease.version if grounds.lease else None,
        event_fields={
            "policy_version": grounds.policy_version,
            **_digest_field(ctx, grounds.policy_version),
            "credential_version": grounds.lease.version if grounds.lease else None,
        },
    )
    state = breaker_after_dispatch(
        tenant=ctx.run.tenant, seen=ctx.tenant.breaker if ctx.tenant is not None else None, now=ctx.now
    )
    return Dispatched(
        op,
        reservation_id=reservation.pk if reservation is not None else None,
        levers=breaker_levers(policy=grounds.policy, state=state),
    )
