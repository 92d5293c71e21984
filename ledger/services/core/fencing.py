"""The fence: every write that carries a fencing token goes through :func:`fenced`.

``fenced`` locks the run and its lease row in one statement (``SELECT ... FOR UPDATE``;
on SQLite the IMMEDIATE transaction holds the database write lock instead), checks the
token, owner and expiry under that lock, and only then runs the write, in the same
transaction. A refused write is counted on the run and leaves a STALE_TOKEN_REJECTED
event in its chain; the refusal is raised after that record has committed.
"""

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, TypeVar

from django.db import connection, transaction
from django.db.models import F, Field
from django.utils import timezone

from ledger.actors import worker_actor
from ledger.errors import DomainError, NotFound, RunCancelled, RunCompleted, StaleToken, parse_id, worker_refusal
from ledger.models import Operation, Run, RunLease, Tenant, Worker, WorkerDrain
from ledger.services.evidence.append import ChainBatch

T = TypeVar("T")


def locked_runs(
    queryset_filter: dict, *, skip_locked: bool = False, limit: int | None = None, order_by: str = "expires_at"
) -> list[Run]:
    """Runs with their leases, both rows locked (in one statement) until the transaction ends.
    A caller that may wait for these locks while holding others takes them in ``run_id``
    order.

    The query starts from the lease so that the join to the run is an inner join, which
    ``FOR UPDATE`` can lock on both sides."""
    leases = (
        RunLease.objects.select_for_update(of=("self", "run"), skip_locked=skip_locked)
        .select_related("run")
        .filter(**queryset_filter)
        .order_by(order_by)
    )
    if limit is not None:
        leases = leases[:limit]
    runs = []
    for lease in leases:
        run = lease.run
        run.lease = lease
        runs.append(run)
    return runs


def _column(field: Field) -> str:
    """The column of a concrete field (Django calls a field concrete when it has one)."""
    if field.column is None:
        raise AssertionError(f"{field} is concrete but has no column")
    return field.column


def _lock_sql() -> tuple[str, list[str], list[str]]:
    """The hot path's one statement, written once: the lease and its run, both locked.
    (The ORM spent more CPU compiling this query than PostgreSQL spent running it.)"""
    qn = connection.ops.quote_name
    lease_fields = [f.attname for f in RunLease._meta.concrete_fields]
    run_fields = [f.attname for f in Run._meta.concrete_fields]
    columns = [f"l.{qn(_column(f))}" for f in RunLease._meta.concrete_fields] + [
        f"r.{qn(_column(f))}" for f in Run._meta.concrete_fields
    ]
    # Table and column names come from the models; every value is a parameter.
    sql = (
        f"SELECT {', '.join(columns)} FROM {qn(RunLease._meta.db_table)} l "  # noqa: S608
        f"JOIN {qn(Run._meta.db_table)} r ON r.id = l.run_id WHERE r.tenant_id = %s AND l.run_id = "
    )
    return sql, lease_fields, run_fields


_LOCK = None


_BY_RUN = "%s"
_BY_OPERATION = f"(SELECT run_id FROM {Operation._meta.db_table} WHERE id = %s AND tenant_id = %s)"  # noqa: S608 - a table name


def lock_run(*, tenant: Tenant, run_id: object = None, operation_id: object = None) -> Run:
    """One run of ``tenant`` — named directly or as the run of one of its operations — with
    its lease, both rows locked by one statement until the transaction ends."""
    if connection.vendor != "postgresql":  # the embedded default: plain ORM, typed by Django
        if operation_id is not None:
            op_id = parse_id(operation_id, "operation")
            run_id = Operation.objects.filter(pk=op_id, tenant=tenant).values_list("run_id", flat=True).first()
            if run_id is None:
                raise NotFound("operation not found")
        runs = locked_runs({"run__tenant": tenant, "run_id": parse_id(run_id, "run")})
        if not runs:
            raise NotFound("run not found")
        return runs[0]
    global _LOCK
    if _LOCK is None:
        _LOCK = _lock_sql()
    sql, lease_fields, run_fields = _LOCK
    params: list[int | uuid.UUID]
    if operation_id is not None:
        sql += _BY_OPERATION
        params = [tenant.pk, parse_id(operation_id, "operation"), tenant.pk]
        missing = "operation not found"
    else:
        sql += _BY_RUN
        params = [tenant.pk, parse_id(run_id, "run")]
        missing = "run not found"
    sql += " FOR UPDATE OF l, r"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        raise NotFound(missing)
    lease = RunLease.from_db(connection.alias, lease_fields, row[: len(lease_fields)])
    run = Run.from_db(connection.alias, run_fields, row[len(lease_fields) :])
    run.lease, lease.run = lease, run
    _RUN_TENANT.set_cached_value(run, tenant)  # the statement matched run.tenant_id = tenant.pk
    return run


_RUN_TENANT = Run._meta.get_field("tenant")


def fence_reason(lease: RunLease, token: int, now: datetime, *, owner_id: str | None = None) -> str | None:
    """Why ``token`` (and ``owner_id``, when given) may not write now; None when it may."""
    if lease.owner_id is None and lease.fencing_token == token:
        return (lease.end_reason or "not_held").lower()  # ended (or never held), nobody holds it now
    if owner_id is not None and lease.owner_id != owner_id:
        return "owner_changed"
    if lease.fencing_token != token:
        return "token_changed"
    # Owned from here on, so it has an expiry (the check constraint lease_owned_has_expiry_and_token).
    if lease.expires_at is None:
        raise AssertionError("an owned lease has no expires_at")
    if lease.expires_at <= now:
        return "expired"
    return None


@dataclass
class Fenced:
    """What a fenced write gets: the locked run, its chain batch, the clock and the actor."""

    run: Run
    batch: ChainBatch
    now: datetime
    actor: str
    token: int

    @property
    def lease(self) -> RunLease:
        return self.run.lease


class Ending(Protocol):
    """How a fenced write meets a run that is ending (``ledger.services.fence.ending``):
    ``before`` may end the run first (its maximum runtime has passed) and returns the
    refusal of a write the run no longer takes; ``after`` finishes a cancelled run once
    nothing is left in flight. Both read the locked run only, so an ACTIVE run without a
    deadline costs no statement."""

    def before(self, ctx: "Fenced") -> DomainError | None: ...

    def after(self, ctx: "Fenced") -> None: ...


def run_cancelled(run: Run) -> RunCancelled:
    return RunCancelled(
        run_status=run.status, ending=run.ending, cancel_reason=run.cancel_reason, grace_until=run.cancel_grace_until
    )


def worker_refused(worker: Worker, what: str) -> DomainError:
    """The refusal of new work to a worker that is not ACCEPTING. A DRAINING worker's refused
    claim is counted on its open drain (the drain article's stale_claim_rejections), in its own
    statement: the refusal writes nothing else."""
    if worker.status == "DRAINING":
        WorkerDrain.objects.filter(worker_id=worker.pk, quiesced_at__isnull=True).update(
            stale_claim_rejections=F("stale_claim_rejections") + 1
        )
    return worker_refusal(worker.status, what)


def refuse_new_work(run: Run) -> None:
    """For writes that add work or authority to a run (capabilities, credential leases,
    resources): only an ACTIVE run takes them."""
    if run.status != "ACTIVE":
        raise run_cancelled(run) if run.status != "COMPLETED" else RunCompleted("the run is completed")


def fenced[T](
    *,
    worker: Worker,
    run_id: object = None,
    operation_id: object = None,
    token: int,
    attempted: str,
    write: Callable[[Fenced], T],
    owner_id: str | None = None,
    on_refused: Callable[[Fenced, str], None] | None = None,
    refusal: Callable[[str], DomainError] = StaleToken,
    ending: Ending | None = None,
) -> T:
    """Run ``write`` under the fence, or record and raise the refusal. A presenter whose
    lease ended with its run's cancellation is answered 409 RUN_CANCELLED."""
    with transaction.atomic():
        run = lock_run(tenant=worker.tenant, run_id=run_id, operation_id=operation_id)
        now = timezone.now()
        reason = fence_reason(run.lease, token, now, owner_id=owner_id)
        # The presenter is the lease's owner only if the fence holds; otherwise all we
        # know is the worker identity and the token it presented.
        if reason is None:
            holder = run.lease.owner_id
            if holder is None:  # fence_reason passes only an owned lease
                raise AssertionError("the fence passed a lease nobody owns")
            presenter = owner_id or holder
        else:
            presenter = owner_id or f"token-{token}"
        ctx = Fenced(run=run, batch=ChainBatch(now), now=now, actor=worker_actor(worker, presenter), token=token)
        refused: DomainError | None
        if reason is None:
            refused = ending.before(ctx) if ending is not None else None
            if refused is None:
                result = write(ctx)
                if ending is not None:
                    ending.after(ctx)
                ctx.batch.commit()
                return result
        else:
            record_refusal(ctx, attempted=attempted, reason=reason)
            if on_refused is not None:
                on_refused(ctx, reason)
            refused = run_cancelled(run) if reason == "cancelled" else refusal(reason)
        ctx.batch.commit()  # the refusal's record (or the timeout that caused it) stays
    raise refused


def decided[T](result: tuple[T, DomainError | None]) -> T:
    """For a write that records its own refusal (an operation DENIED, an approval asked)
    and returns ``(value, refusal)``: ``fenced`` has committed that record; now raise the
    refusal, or return the value."""
    value, refusal = result
    if refusal is not None:
        raise refusal
    return value


def record_refusal(ctx: Fenced, *, attempted: str, reason: str) -> None:
    Run.objects.filter(pk=ctx.run.pk).update(stale_rejections=F("stale_rejections") + 1)
    ctx.run.stale_rejections += 1
    ctx.batch.append(
        ctx.run,
        "STALE_TOKEN_REJECTED",
        actor=ctx.actor,
        fields={
            "attempted": attempted,
            "presented_token": ctx.token,
            "current_token": ctx.lease.fencing_token,
            "reason": reason,
        },
    )


def fence_check(*, tenant: Tenant, run_id: object, fencing_token: int) -> bool:
    """Read-only: is ``fencing_token`` the run's current, unexpired token right now?"""
    try:
        run_uuid = parse_id(run_id, "run")
    except NotFound:
        return False
    lease = RunLease.objects.filter(run_id=run_uuid, run__tenant=tenant).first()
    return lease is not None and fence_reason(lease, fencing_token, timezone.now()) is None
