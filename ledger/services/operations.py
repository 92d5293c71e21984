"""Operation services: intent, authorize, dispatch, outcome, and the move to UNKNOWN.

Every phase change is a conditional UPDATE on the operation's current phase, made under
the fence (run and lease rows locked), and appends exactly one event to the run's chain.
"""

from dataclasses import asdict, dataclass

from django.db import IntegrityError, transaction

from approvals.models import ApprovalKind, CaseReason
from approvals.services.approvals import approval_open, approval_usable, approval_use
from approvals.services.cases import (
    case_attach_unverified_evidence,
    cases_open,
    open_case_for,
)
from ledger.boundary import check_fields
from ledger.models import Operation, Run, Tenant, Worker
from ledger.services import authority
from ledger.services.costs import breaker_allows, cost_mark_unknown, cost_settle
from ledger.services.errors import (
    ApprovalRequired,
    Denied,
    IdempotencyMismatch,
    NotFound,
    ReconcileFirst,
    WrongPhase,
)
from ledger.services.events import ChainBatch, json_safe
from ledger.services.fencing import Fenced, fenced, parse_id
from ledger.services.policy import policy_current
from ledger.services.retry import operation_retry_decision
from ledger.states import OUTCOME_PHASE, EffectClass, Outcome, Phase, can_move

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
)


@dataclass(frozen=True)
class Intent:
    tool: str
    action: str
    resource: str
    effect_class: EffectClass
    idempotency_key: str
    args_digest: str = ""
    provider: str = ""
    estimated_cost_cents: int | None = None
    payload_bytes: int | None = None


def transition(
    op: Operation, target: Phase, ctx: Fenced, *, reason: str | None = None, event_fields: dict | None = None, **changes
) -> None:
    """Move ``op`` to ``target`` if it is still in the phase we read, and log the event."""
    source = Phase(op.phase)
    if not can_move(source, target):
        raise WrongPhase(phase=source, wanted=" or ".join(sorted(p for p in Phase if can_move(p, target))))
    won = Operation.objects.filter(pk=op.pk, phase=source).update(phase=target, updated_at=ctx.now, **changes)
    if won != 1:  # impossible while the run is locked; refuse rather than guess
        raise WrongPhase(phase="changed concurrently", wanted=source)
    ctx.batch.count_move(ctx.run, source, target)
    op.phase = target
    for name, value in changes.items():
        setattr(op, name, value)
    fields = {"operation_id": op.pk, "from": source.value, "to": target.value, "attempt": op.attempt}
    if reason:
        fields["reason"] = reason
    fields.update({k: v for k, v in changes.items() if k in _LOGGED_CHANGES and v not in (None, "")})
    fields.update({k: v for k, v in (event_fields or {}).items() if v is not None})
    ctx.batch.append(ctx.run, f"OPERATION_{target.value}", actor=ctx.actor, fields=fields)


_LOGGED_CHANGES = {"dispatch_token", "provider_request_id", "actual_cost_cents", "error_code"}


def operation_get(*, tenant: Tenant, operation_id: object) -> Operation:
    op = Operation.objects.filter(tenant=tenant, pk=parse_id(operation_id, "operation")).first()
    if op is None:
        raise NotFound("operation not found")
    return op


def operation_intend(*, worker: Worker, run_id: object, fencing_token: int, intent: Intent) -> tuple[Operation, bool]:
    """Record the intent to perform a side effect. Idempotent per (tenant, key):
    returns ``(operation, created)``; the same key with other parameters is refused."""
    check_fields(asdict(intent))  # every parameter is stored, not all of them in the event

    def write(ctx: Fenced) -> tuple[Operation, bool]:
        existing = Operation.objects.filter(tenant=worker.tenant, idempotency_key=intent.idempotency_key).first()
        if existing is not None:
            return _replay(existing, ctx.run, intent), False
        op = Operation(
            tenant=worker.tenant,
            run=ctx.run,
            idempotency_key=intent.idempotency_key,
            tool=intent.tool,
            action=intent.action,
            resource=intent.resource,
            effect_class=intent.effect_class,
            args_digest=intent.args_digest,
            provider=intent.provider,
            estimated_cost_cents=intent.estimated_cost_cents,
            payload_bytes=intent.payload_bytes,
            phase=Phase.PLANNED,
            updated_at=ctx.now,
        )
        try:
            with transaction.atomic():
                op.save(force_insert=True)
        except IntegrityError:
            # The same key was taken at this moment by another run of the tenant.
            existing = Operation.objects.filter(tenant=worker.tenant, idempotency_key=intent.idempotency_key).first()
            if existing is None:
                raise
            return _replay(existing, ctx.run, intent), False
        ctx.batch.count_move(ctx.run, None, Phase.PLANNED)
        ctx.batch.append(
            ctx.run,
            "OPERATION_PLANNED",
            actor=ctx.actor,
            fields={
                "operation_id": op.pk,
                "to": Phase.PLANNED.value,
                "attempt": op.attempt,
                "tool": op.tool,
                "action": op.action,
                "resource": op.resource,
                "effect_class": op.effect_class,
                "idempotency_key": op.idempotency_key,
                "args_digest": op.args_digest,
                "fencing_token": ctx.token,
            },
        )
        return op, True

    return fenced(worker=worker, run_id=run_id, token=fencing_token, attempted="operation.intend", write=write)


def _replay(existing: Operation, run: Run, intent: Intent) -> Operation:
    wanted = {"run_id": run.pk, **{k: getattr(intent, k) for k in INTENT_PARAMETERS if k != "run_id"}}
    differing = [k for k in INTENT_PARAMETERS if getattr(existing, k) != wanted[k]]
    if differing:
        raise IdempotencyMismatch(
            "idempotency_key is already used by an operation with a different " + ", ".join(differing),
            differing=differing,
        )
    return existing


def _on_operation(worker: Worker, op_id, token: int, attempted: str, write, **options):
    """A fenced write on the run of operation ``op_id`` (locked through the operation)."""
    return fenced(worker=worker, operation_id=op_id, token=token, attempted=attempted, write=write, **options)


def _decided(result: tuple[Operation, Exception | None]) -> Operation:
    """Raise the refusal a fenced write recorded (after its transaction committed)."""
    op, refusal = result
    if refusal is not None:
        raise refusal
    return op


def _deny(op: Operation, ctx: Fenced, denial: Denied) -> Denied:
    """Record a refusal as the operation's own transition: a later decision is a new event."""
    transition(
        op,
        Phase.DENIED,
        ctx,
        reason=denial.detail,
        decision_code=denial.code,
        decision_policy_version=denial.extra.get("policy_version"),
        event_fields={"decision": denial.code, **({"budget": denial.extra["budget"]} if "budget" in denial.extra else {})},
    )
    return denial


def operation_authorize(
    *, worker: Worker, operation_id: object, fencing_token: int, credential_lease_id: object = None
) -> Operation:
    """Decide an operation: ALLOW (AUTHORIZED), APPROVAL_REQUIRED (PENDING_APPROVAL, raises
    ApprovalRequired) or DENY_* (DENIED, raises Denied). See ledger.services.authority."""
    op_id = parse_id(operation_id, "operation")

    def write(ctx: Fenced) -> tuple[Operation, Exception | None]:
        op = Operation.objects.select_related("credential_lease").get(pk=op_id)
        if op.phase == Phase.AUTHORIZED:
            return op, None  # already decided; dispatch checks it all again
        if op.phase not in (Phase.PLANNED, Phase.PENDING_APPROVAL):
            raise WrongPhase(phase=op.phase, wanted="PLANNED or PENDING_APPROVAL")
        try:
            grounds = authority.evaluate(op=op, ctx=ctx, lease_id=credential_lease_id)
        except Denied as denial:
            return op, _deny(op, ctx, denial)
        if grounds.needs_approval:
            approval = grounds.waiting_for or approval_open(
                run=ctx.run,
                kind=ApprovalKind.OPERATION,
                token=ctx.token,
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
                    event_fields={"approval_id": approval.pk},
                )
            return op, ApprovalRequired(approval.pk)
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
                "credential_lease_id": grounds.lease.pk if grounds.lease else None,
                "capability_id": grounds.capability.pk if grounds.capability else None,
            },
        )
        return op, None

    return _decided(_on_operation(worker, op_id, fencing_token, "operation.authorize", write))


def operation_dispatch(*, worker: Worker, operation_id: object, fencing_token: int) -> Operation:
    """AUTHORIZED -> DISPATCHED after every authorize check passes again under the current
    policy and the reservations hold. Only after this succeeds may the worker call the
    provider. A refusal moves the operation to DENIED (and reserves nothing)."""
    op_id = parse_id(operation_id, "operation")

    def write(ctx: Fenced) -> tuple[Operation, Exception | None]:
        op = Operation.objects.select_related("credential_lease").get(pk=op_id)
        if op.phase != Phase.AUTHORIZED:
            raise WrongPhase(phase=op.phase, wanted=Phase.AUTHORIZED)
        try:
            with ctx.batch.savepoint():
                grounds = authority.evaluate(op=op, ctx=ctx, at_dispatch=True)
                if grounds.needs_approval:
                    raise Denied("DENY_POLICY", "the approval this operation needs is missing, used, expired or void")
                authority.reserve(op=op, ctx=ctx, grounds=grounds)
                transition(
                    op,
                    Phase.DISPATCHED,
                    ctx,
                    dispatched_at=ctx.now,
                    dispatch_token=ctx.token,
                    dispatch_owner_id=ctx.lease.owner_id,
                    policy_version_at_dispatch=grounds.policy_version,
                    credential_version_at_dispatch=grounds.lease.version if grounds.lease else None,
                    event_fields={
                        "policy_version": grounds.policy_version,
                        "credential_version": grounds.lease.version if grounds.lease else None,
                    },
                )
        except Denied as denial:
            op.refresh_from_db()
            return op, _deny(op, ctx, denial)
        return op, None

    return _decided(_on_operation(worker, op_id, fencing_token, "operation.dispatch", write))


def operation_retry(*, worker: Worker, operation_id: object, fencing_token: int) -> Operation:
    """A new attempt of a FAILED (or reconciled as not happened) operation, as the retry
    decision allows: RETRY / RETRY_SAME_KEY start attempt + 1 (same idempotency key);
    RECONCILE refuses (RECONCILE_FIRST); APPROVAL asks for, or uses, an approval bound to
    this operation, attempt, args digest and fencing token."""
    op_id = parse_id(operation_id, "operation")

    def write(ctx: Fenced) -> tuple[Operation, Exception | None]:
        op = Operation.objects.get(pk=op_id)
        decision, reason = operation_retry_decision(op)
        if decision == "RECONCILE":
            raise ReconcileFirst(reason)
        if decision == "STOP":
            raise WrongPhase(phase=op.phase, wanted="FAILED, or RECONCILED as not having happened")
        version, policy = policy_current(tenant=ctx.run.tenant)
        refusal = breaker_allows(tenant=ctx.run.tenant, op=op, policy=policy, attempt_is_retry=True)
        if refusal is not None:
            raise refusal
        if decision == "APPROVAL":
            approval = approval_usable(operation=op, kind=ApprovalKind.RETRY, token=ctx.token, now=ctx.now)
            if approval is None:
                asked = approval_open(
                    run=ctx.run,
                    kind=ApprovalKind.RETRY,
                    token=ctx.token,
                    ttl_s=policy["approval_ttl_s"],
                    batch=ctx.batch,
                    actor=ctx.actor,
                    operation=op,
                )
                return op, ApprovalRequired(asked.pk)
            approval_use(approval=approval, run=ctx.run, batch=ctx.batch, actor=ctx.actor)
        transition(
            op,
            Phase.PLANNED,
            ctx,
            reason=f"retry: {reason}",
            attempt=op.attempt + 1,
            dispatched_at=None,
            dispatch_token=None,
            dispatch_owner_id=None,
            provider_request_id="",
            actual_cost_cents=None,
            error_code="",
            reconciliation="",
            decision_code="",
        )
        return op, None

    return _decided(_on_operation(worker, op_id, fencing_token, "operation.retry", write))


def operation_report_outcome(
    *,
    worker: Worker,
    operation_id: object,
    fencing_token: int,
    outcome: Outcome,
    provider_request_id: str = "",
    actual_cost_cents: int | None = None,
    error_code: str = "",
) -> Operation:
    """DISPATCHED -> CONFIRMED / FAILED / UNKNOWN (UNKNOWN opens a reconciliation case).

    The same report sent twice returns the operation unchanged. A report carrying a
    fenced token is refused; if it names a provider request id, that id is kept on the
    operation's reconciliation case as unverified evidence."""
    op_id = parse_id(operation_id, "operation")
    target = OUTCOME_PHASE[Outcome(outcome)]

    def write(ctx: Fenced) -> Operation:
        op = Operation.objects.get(pk=op_id)
        if op.phase == target and op.dispatch_token == ctx.token and op.provider_request_id == provider_request_id:
            if target != Phase.UNKNOWN and actual_cost_cents is not None:
                # The same report again, now with the usage that was missing: it settles the
                # reservation left UNKNOWN (a closed one is left as it is).
                cost_settle(op=op, run=ctx.run, actual_cents=actual_cost_cents, batch=ctx.batch, actor=ctx.actor, now=ctx.now)
            return op  # a duplicate of the report that was already recorded
        if op.phase != Phase.DISPATCHED:
            raise WrongPhase(phase=op.phase, wanted=Phase.DISPATCHED)
        if op.dispatch_token != ctx.token:
            raise WrongPhase(phase=f"{op.phase} under another token", wanted="DISPATCHED under this token")
        changes = {
            "provider_request_id": provider_request_id,
            "actual_cost_cents": actual_cost_cents,
            "error_code": error_code,
        }
        if target != Phase.UNKNOWN:
            transition(op, target, ctx, **changes)
            # Usage settles the reservation; no usage reported leaves it UNKNOWN until reconciled.
            cost_settle(op=op, run=ctx.run, actual_cents=actual_cost_cents, batch=ctx.batch, actor=ctx.actor, now=ctx.now)
        else:
            operations_mark_unknown(
                operations=[op],
                runs={ctx.run.pk: ctx.run},
                batch=ctx.batch,
                actor=ctx.actor,
                reason=CaseReason.WORKER_REPORTED_UNKNOWN,
                changes=changes,
            )
        return op

    def on_refused(ctx: Fenced, reason: str) -> None:
        op = Operation.objects.get(pk=op_id)
        if op.phase == Phase.DISPATCHED and op.dispatch_token == ctx.token:
            # The reporter dispatched this effect and has lost its lease since: nobody can
            # report for it any more, so its outcome is UNKNOWN now, not at the next sweep.
            operations_mark_unknown(
                operations=[op],
                runs={ctx.run.pk: ctx.run},
                batch=ctx.batch,
                actor=ctx.actor,
                reason=CaseReason.LEASE_LOST,
            )
        if not provider_request_id:
            return
        evidence = json_safe(
            {
                "provider_request_id": provider_request_id,
                "reported_outcome": Outcome(outcome).value,
                "fencing_token": ctx.token,
                "reported_at": ctx.now,
                "verified": False,
            }
        )
        case = open_case_for(op.pk)
        if case is not None:
            case_attach_unverified_evidence(case=case, evidence=evidence)
        ctx.batch.append(
            ctx.run,
            "UNVERIFIED_EVIDENCE_RECEIVED",
            actor=ctx.actor,
            fields={"operation_id": op.pk, "case_id": case.pk if case else None, **evidence},
        )

    return _on_operation(worker, op_id, fencing_token, "operation.outcome", write, on_refused=on_refused)


def operations_mark_unknown(
    *,
    operations: list[Operation],
    runs: dict,
    batch: ChainBatch,
    actor: str,
    reason: CaseReason,
    changes: dict | None = None,
) -> dict:
    """DISPATCHED -> UNKNOWN for a set of operations whose runs the caller has locked, in
    one UPDATE, with one reconciliation case and one event each. Returns {op_id: case}."""
    if not operations:
        return {}
    changes = changes or {}
    ids = [op.pk for op in operations]
    moved = Operation.objects.filter(pk__in=ids, phase=Phase.DISPATCHED).update(
        phase=Phase.UNKNOWN, updated_at=batch.now, **changes
    )
    if moved != len(ids):  # impossible while the runs are locked
        raise WrongPhase(phase="changed concurrently", wanted=Phase.DISPATCHED)
    cases = cases_open(operations=operations, reason=reason, now=batch.now)
    for op in operations:
        op.phase = Phase.UNKNOWN
        for name, value in changes.items():
            setattr(op, name, value)
        fields = {
            "operation_id": op.pk,
            "from": Phase.DISPATCHED.value,
            "to": Phase.UNKNOWN.value,
            "attempt": op.attempt,
            "reason": reason.value,
            "case_id": cases[op.pk].pk,
        }
        fields.update({k: v for k, v in changes.items() if k in _LOGGED_CHANGES and v not in (None, "")})
        batch.count_move(runs[op.run_id], Phase.DISPATCHED, Phase.UNKNOWN)
        batch.append(runs[op.run_id], "OPERATION_UNKNOWN", actor=actor, fields=fields)
    # Their cost reservations stay counted, as UNKNOWN, until reconciliation settles them.
    cost_mark_unknown(ops=operations, runs=runs, batch=batch, actor=actor, now=batch.now, reason=reason)
    return cases


def operations_orphaned(*, run_ids: list) -> list[Operation]:
    """The DISPATCHED operations of runs whose lease was lost (runs locked by the caller)."""
    return list(Operation.objects.filter(run_id__in=run_ids, phase=Phase.DISPATCHED).order_by("created_at"))
