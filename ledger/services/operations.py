"""Operation services: intent, authorize, dispatch, outcome, and the move to UNKNOWN.

Every phase change is a conditional UPDATE on the operation's current phase, made under
the fence (run and lease rows locked), and appends exactly one event to the run's chain.
"""

from dataclasses import asdict, dataclass

from django.db import IntegrityError, transaction

from approvals.models import CaseReason
from approvals.services.cases import case_attach_unverified_evidence, cases_open, open_case_for
from ledger.boundary import check_fields
from ledger.models import Operation, Run, Tenant, Worker
from ledger.services.errors import IdempotencyMismatch, NotFound, WrongPhase
from ledger.services.events import ChainBatch, json_safe
from ledger.services.fencing import Fenced, fenced, parse_id
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


def _transition(op: Operation, target: Phase, ctx: Fenced, *, reason: str | None = None, **changes) -> None:
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
    ctx.batch.append(ctx.run, f"OPERATION_{target.value}", actor=ctx.actor, fields=fields)


_LOGGED_CHANGES = {"dispatch_token", "provider_request_id", "actual_cost_cents", "error_code"}


def _operation_run_id(tenant: Tenant, operation_id: object):
    run_id = (
        Operation.objects.filter(tenant=tenant, pk=parse_id(operation_id, "operation"))
        .values_list("run_id", flat=True)
        .first()
    )
    if run_id is None:
        raise NotFound("operation not found")
    return run_id


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


def operation_authorize(*, worker: Worker, operation_id: object, fencing_token: int) -> Operation:
    """Placeholder authority: ALLOW for any operation of the caller's run presented with the
    run's current token. Tenant policy, credentials and budgets replace this later."""
    op_id = parse_id(operation_id, "operation")

    def write(ctx: Fenced) -> Operation:
        op = Operation.objects.get(pk=op_id)
        if op.phase == Phase.AUTHORIZED:
            return op
        _transition(op, Phase.AUTHORIZED, ctx, reason="placeholder policy: allow")
        return op

    return fenced(
        worker=worker,
        run_id=_operation_run_id(worker.tenant, op_id),
        token=fencing_token,
        attempted="operation.authorize",
        write=write,
    )


def operation_dispatch(*, worker: Worker, operation_id: object, fencing_token: int) -> Operation:
    """AUTHORIZED -> DISPATCHED. Only after this succeeds may the worker call the provider."""
    op_id = parse_id(operation_id, "operation")

    def write(ctx: Fenced) -> Operation:
        op = Operation.objects.get(pk=op_id)
        if op.phase != Phase.AUTHORIZED:
            raise WrongPhase(phase=op.phase, wanted=Phase.AUTHORIZED)
        _transition(
            op,
            Phase.DISPATCHED,
            ctx,
            dispatched_at=ctx.now,
            dispatch_token=ctx.token,
            dispatch_owner_id=ctx.lease.owner_id,
        )
        return op

    return fenced(
        worker=worker,
        run_id=_operation_run_id(worker.tenant, op_id),
        token=fencing_token,
        attempted="operation.dispatch",
        write=write,
    )


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
        if target == Phase.UNKNOWN:
            operations_mark_unknown(
                operations=[op],
                runs={ctx.run.pk: ctx.run},
                batch=ctx.batch,
                actor=ctx.actor,
                reason=CaseReason.WORKER_REPORTED_UNKNOWN,
                changes=changes,
            )
        else:
            _transition(op, target, ctx, **changes)
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

    return fenced(
        worker=worker,
        run_id=_operation_run_id(worker.tenant, op_id),
        token=fencing_token,
        attempted="operation.outcome",
        write=write,
        on_refused=on_refused,
    )


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
    return cases


def operations_orphaned(*, run_ids: list) -> list[Operation]:
    """The DISPATCHED operations of runs whose lease was lost (runs locked by the caller)."""
    return list(Operation.objects.filter(run_id__in=run_ids, phase=Phase.DISPATCHED).order_by("created_at"))
