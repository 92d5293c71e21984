"""The fence: every write that carries a fencing token goes through :func:`fenced`.

``fenced`` locks the run and its lease row in one statement (``SELECT ... FOR UPDATE``),
checks the token, owner and expiry under that lock, and only then runs the write, in the same
transaction. A refused write is counted on the run and leaves a STALE_TOKEN_REJECTED
event in its chain; the refusal is raised after that record has committed.
"""

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ledger.actors import worker_actor
from ledger.errors import (
    DomainError,
    EffectsHeld,
    NotFound,
    RestoreUnchecked,
    RunCancelled,
    RunCompleted,
    StaleToken,
    StateConflictError,
    parse_id,
    worker_refusal,
)
from ledger.models import (
    CapabilityBudget,
    CostReservation,
    CredentialLease,
    Operation,
    Run,
    RunLease,
    Tenant,
    Worker,
    WorkerDrain,
)
from ledger.services.evidence.append import HEAD_FIELDS, ChainBatch
from ledger.sql import fence as sql_fence
from ledger.sql import rows as sql_rows
from ledger.states import CapabilityStatus

T = TypeVar("T")

# Whether a fenced call inside an enclosing transaction takes a savepoint of its own (the
# default). ``one_transaction`` turns it off for calls that compose several fenced steps.
_SAVEPOINTS: ContextVar[bool] = ContextVar("fence_savepoints", default=True)


@contextmanager
def one_transaction() -> Iterator[None]:
    """Fenced calls made inside run in the enclosing transaction without a savepoint each.

    A savepoint per step costs PostgreSQL a MultiXact for every row a step updates after an
    earlier step of the same transaction locked it (the run, its lease, the operation): about
    three per effect started in one call, measured, and twice the backend CPU. Without them a
    step whose write raises leaves the whole transaction to be rolled back (Django's
    ``get_rollback()`` says so): the caller then starts again the way with savepoints. A
    refusal a fenced call raises after its own record (a stale token, a denial) is not such an
    exception: its write completed and what it recorded stays."""
    token = _SAVEPOINTS.set(False)
    try:
        yield
    finally:
        _SAVEPOINTS.reset(token)


def locked_runs(
    queryset_filter: dict[str, Any],
    *,
    skip_locked: bool = False,
    limit: int | None = None,
    order_by: str = "expires_at",
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


def runs_locked_for_sweep(
    *,
    expired_by: datetime | None = None,
    run_ids: Collection[object] = (),
    limit: int | None = None,
    skip_locked: bool = True,
) -> list[Run]:
    """For the sweeps (the reapers, the approval and reservation expiry jobs): runs with
    their leases, locked, as ``locked_runs`` gives them — those whose lease expired by
    ``expired_by`` (oldest expiry first, at most ``limit``), or those of ``run_ids``. With
    ``skip_locked`` (the default) a run busy elsewhere is left for the next pass; without
    it, the locks are waited for, taken in run id order.

    On PostgreSQL, one pre-built statement reads them, and each run is made from its row
    directly (a sweep takes hundreds at a time) with the columns a sweep reads and writes,
    :data:`SWEEP_RUN_COLUMNS` (its chain head and counts, tenant, parent and status; any
    other field loads on first use, as after the ORM's ``only()``; so does a lease's own
    ``run``, which only the run's side caches). The lease rows are locked with the runs
    when the sweep ends the leases (``expired_by``); a sweep by ``run_ids`` writes no lease
    and locks the run rows alone (every writer of a run locks its row, so that lock is the
    one that excludes them), sparing a write to each lease's page."""
    if expired_by is None:
        if not run_ids:
            return []
        rows = sql_fence.runs_by_id(
            run_ids=set(run_ids), limit=limit, skip_locked=skip_locked, run_columns=SWEEP_RUN_COLUMNS
        )
    else:
        rows = sql_fence.runs_expired(
            by=expired_by, limit=limit, skip_locked=skip_locked, run_columns=SWEEP_RUN_COLUMNS
        )
    width = len(sql_fence.LEASE)
    runs = []
    for row in rows:
        lease = sql_rows.from_row(RunLease, row[:width])
        run = sql_rows.loaded(Run, SWEEP_RUN_COLUMNS, row[width:])
        # The run's lease, as select_related sets it; not the lease's run back (no sweep reads
        # it; it would load on first use): without that cycle a batch's runs are freed as
        # soon as it ends, instead of piling up for the garbage collector's older generations.
        _RUN_LEASE.set_cached_value(run, lease)
        runs.append(run)
    return runs


_RUN_LEASE = Run._meta.get_field("lease")
# What a sweep reads of a run and writes back with its chain head (the head is written from
# the instance, field by field, so every head field is loaded).
SWEEP_RUN_COLUMNS = ("id", "tenant_id", "parent_id", "status", "schema_version", *HEAD_FIELDS)


@dataclass(frozen=True)
class TenantSeen:
    """What a decision reads of the run's tenant, read by the statement that locks the run:
    its current policy version and the breaker as stored."""

    policy_version: int
    breaker: tuple[str, str, datetime | None]  # (state, reason, changed at)
    # Held after a restore (ledger/services/upgrades/restore.py): no authorize or dispatch.
    effects_held: bool = False
    effects_held_reason: str = ""

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> "TenantSeen":
        """From (policy_version, breaker_state, breaker_reason, breaker_changed_at[,
        effects_held, effects_held_reason])."""
        held = (bool(row[4]), row[5]) if len(row) > 4 else (False, "")
        return cls(
            policy_version=row[0], breaker=(row[1], row[2], row[3]), effects_held=held[0], effects_held_reason=held[1]
        )


@dataclass
class Locked:
    """What :func:`lock` returns: the run with its lease (both rows locked), the operation
    it was found through (read under that lock, with its credential lease), and the tenant."""

    run: Run
    operation: Operation | None
    tenant: TenantSeen | None


def lock(*, tenant: Tenant, run_id: object = None, operation_id: object = None, capabilities: bool = False) -> Locked:
    """One run of ``tenant`` — named directly or as the run of one of its operations — with
    its lease, both rows locked by one statement until the transaction ends. By operation,
    with ``capabilities``, the same statement also reads the run's capability budgets for
    the operation's tool, which the operation then carries (:data:`CAPABILITIES_SEEN`).
    On a restored image whose fence has not been moved: 503 RESTORE_UNCHECKED."""
    if not sql_fence.fence_at_home():
        raise RestoreUnchecked(
            "this database is a restored image: no lease or fenced write until manage.py restore_check runs on it",
            retry_after_s=settings.FENCELINE["OUTAGE_RETRY_AFTER_S"],
        )
    if operation_id is not None:
        denied = CapabilityStatus.DENIED.value if capabilities else None
        row = sql_fence.lock_operation(
            operation_id=parse_id(operation_id, "operation"), tenant_id=tenant.pk, denied=denied
        )
        if row is None:
            raise NotFound("operation not found")
    else:
        row = sql_fence.lock_run(run_id=parse_id(run_id, "run"), tenant_id=tenant.pk)
        if row is None:
            raise NotFound("run not found")
    lease = sql_rows.from_row(RunLease, row[_AT_LEASE])
    run = sql_rows.from_row(Run, row[_AT_RUN])
    seen = TenantSeen.from_row(row[_AT_TENANT])
    run.lease, lease.run = lease, run
    _RUN_TENANT.set_cached_value(run, tenant)  # the statement matched run.tenant_id = tenant.pk
    if operation_id is None:
        return Locked(run=run, operation=None, tenant=seen)
    return Locked(run=run, operation=_operation_read(row, run, capabilities=capabilities), tenant=seen)


def _operation_read(row: sql_fence.Row, run: Run, *, capabilities: bool) -> Operation:
    """The operation of :func:`lock`'s row by operation, carrying what that statement read
    beside it: its credential lease, the cost reservation of its current attempt and (with
    ``capabilities``) the run's capabilities for its tool. Read again, with its credential
    lease only, when the run moved while the statement waited for its lock."""
    (snapshot_seq,) = row[_AT_SNAPSHOT]
    op = sql_rows.from_row(Operation, row[_AT_OPERATION])
    if snapshot_seq != run.last_seq:  # the run moved while this statement waited for its lock
        fresh = sql_rows.get(Operation, ("credential_lease",), id=op.pk)
        if not isinstance(fresh, Operation):
            raise NotFound("operation not found")
        op = fresh
    else:
        credential_lease = row[_AT_CREDENTIAL_LEASE]
        found = None
        if credential_lease[0] is not None:
            found = sql_rows.from_row(CredentialLease, credential_lease)
            (credential_version,) = row[_AT_CREDENTIAL_VERSION]
            found.__dict__["credential_version_now"] = credential_version  # what evaluation compares it with
        _OPERATION_CREDENTIAL_LEASE.set_cached_value(op, found)
        # The cost reservation of its current attempt (changed only under the run's lock):
        # ``reservations.reservation_of`` reads it from here instead of asking again.
        reservation = row[_AT_RESERVATION]
        op.__dict__[RESERVATION_SEEN] = (
            op.attempt,
            sql_rows.from_row(CostReservation, reservation) if reservation[0] is not None else None,
        )
        if capabilities:
            # The run's capabilities for the tool (changed under the run's lock, but for a
            # delegation to a child run, which only takes calls away: the charge at dispatch
            # is conditional and refuses what is no longer there).
            arrays = row[_AT_CAPABILITY]
            budgets = zip(*arrays, strict=True) if arrays[0] is not None else ()
            op.__dict__[CAPABILITIES_SEEN] = [sql_rows.from_row(CapabilityBudget, budget) for budget in budgets]
    _OPERATION_RUN.set_cached_value(op, run)
    return op


def _spans(*widths: int) -> list[slice]:
    """Consecutive slices of these widths: where each part of a row sits."""
    spans, at = [], 0
    for width in widths:
        spans.append(slice(at, at + width))
        at += width
    return spans


# Where each part of the locking statement's row sits (``ledger.sql.fence``: its columns, in
# order): by run, the lease, the run and the tenant; by operation, then also the run's last
# seq as the statement's snapshot saw it, the operation, its credential lease, the
# credential's version, the current attempt's reservation and (with capabilities) one array
# per capability column.
(
    _AT_LEASE,
    _AT_RUN,
    _AT_TENANT,
    _AT_SNAPSHOT,
    _AT_OPERATION,
    _AT_CREDENTIAL_LEASE,
    _AT_CREDENTIAL_VERSION,
    _AT_RESERVATION,
    _AT_CAPABILITY,
) = _spans(
    len(sql_fence.LEASE),
    len(sql_fence.RUN),
    len(sql_fence.TENANT),
    1,
    len(sql_fence.OPERATION),
    len(sql_fence.CREDENTIAL_LEASE),
    1,
    len(sql_fence.RESERVATION),
    len(sql_fence.CAPABILITY),
)


def lock_run(*, tenant: Tenant, run_id: object = None, operation_id: object = None) -> Run:
    """The run of :func:`lock`, with its lease, both locked."""
    return lock(tenant=tenant, run_id=run_id, operation_id=operation_id).run


_RUN_TENANT = Run._meta.get_field("tenant")
# The key under which a locked operation carries (its attempt, that attempt's cost reservation
# or None) as the fence's statement read them.
RESERVATION_SEEN = "cost_reservation_seen"
# The key under which a locked operation carries the run's capability budgets for its tool
# (all but DENIED) as the fence's statement read them; taken by the first check that reads them.
CAPABILITIES_SEEN = "capabilities_seen"
_OPERATION_RUN = Operation._meta.get_field("run")
_OPERATION_CREDENTIAL_LEASE = Operation._meta.get_field("credential_lease")


def fence_reason(lease: RunLease, fencing_token: int, now: datetime, *, owner_id: str | None = None) -> str | None:
    """Why ``fencing_token`` (and ``owner_id``, when given) may not write now; None when it may."""
    if lease.owner_id is None and lease.fencing_token == fencing_token:
        return (lease.end_reason or "not_held").lower()  # ended (or never held), nobody holds it now
    if owner_id is not None and lease.owner_id != owner_id:
        return "owner_changed"
    if lease.fencing_token != fencing_token:
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
    fencing_token: int
    # Read by the statement that locked the run: the operation the write was asked about
    # (by operation id) and what decisions read of the tenant.
    operation: Operation | None = None
    tenant: TenantSeen | None = None

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
    fencing_token: int,
    attempted: str,
    write: Callable[[Fenced], T],
    owner_id: str | None = None,
    on_refused: Callable[[Fenced, str], None] | None = None,
    refusal: Callable[[str], DomainError] = StaleToken,
    ending: Ending | None = None,
    capabilities: bool = False,
) -> T:
    """Run ``write`` under the fence, or record and raise the refusal. A presenter whose
    lease ended with its run's cancellation is answered 409 RUN_CANCELLED. ``capabilities``:
    the locking statement also reads the run's capabilities for the operation's tool
    (:func:`lock`), for a write that checks them (authorize, dispatch)."""
    batch: ChainBatch | None = None
    try:
        with transaction.atomic(savepoint=_SAVEPOINTS.get()):
            locked = lock(tenant=worker.tenant, run_id=run_id, operation_id=operation_id, capabilities=capabilities)
            run = locked.run
            now = timezone.now()
            reason = fence_reason(run.lease, fencing_token, now, owner_id=owner_id)
            batch = ChainBatch(now, defer=True)
            ctx = Fenced(
                run=run,
                batch=batch,
                now=now,
                actor=worker_actor(worker, presenter(run.lease, fencing_token, reason, owner_id=owner_id)),
                fencing_token=fencing_token,
                operation=locked.operation,
                tenant=locked.tenant,
            )
            refused: DomainError | None
            if reason is None:
                refused = conflicted(run) or (ending.before(ctx) if ending is not None else None)
                if refused is None:
                    result = write(ctx)
                    if ending is not None:
                        ending.after(ctx)
                    ctx.batch.commit()
                    return result
            elif run.status == "COMPLETED":
                # Not a stale writer: the run is over (its lease ended with it). Nothing is recorded
                # in the completed run's chain.
                refused = RunCompleted("the run is completed: it takes no more writes")
            else:
                record_refusal(ctx, attempted=attempted, reason=reason)
                if on_refused is not None:
                    on_refused(ctx, reason)
                refused = run_cancelled(run) if reason == "cancelled" else refusal(reason)
            ctx.batch.commit()  # the refusal's record (or the timeout that caused it) stays
    finally:
        if batch is not None:
            batch.close()
    raise refused


def presenter(lease: RunLease, fencing_token: int, reason: str | None, *, owner_id: str | None = None) -> str:
    """Who presented ``fencing_token``, for the actor of what the fenced call records: the
    lease's owner only if the fence holds (``reason`` None); otherwise all we know is the
    worker identity (``owner_id``, when the call names one) and the token it presented."""
    if reason is not None:
        return owner_id or f"token-{fencing_token}"
    if lease.owner_id is None:  # fence_reason passes only an owned lease
        raise AssertionError("the fence passed a lease nobody owns")
    return owner_id or lease.owner_id


def conflicted(run: Run) -> StateConflictError | None:
    """The refusal of every fenced call on a run with an open StateConflict: automation on
    it waits until a person decides which representation of its record is right."""
    if not run.open_conflicts:
        return None
    return StateConflictError(
        f"this run has {run.open_conflicts} open state conflict{'s' if run.open_conflicts != 1 else ''}: "
        "a record's two representations disagree and a person must decide which is right (console: Upgrades)",
        run_id=str(run.pk),
        open_conflicts=run.open_conflicts,
    )


def effects_held(ctx: "Fenced") -> None:
    """Refuse an authorize or a dispatch while the tenant's effects are held (after a restore)."""
    if ctx.tenant is not None and ctx.tenant.effects_held:
        raise EffectsHeld(
            "effects are held for this tenant after a restore: workers may read and record, not act, "
            f"until a person allows effects ({ctx.tenant.effects_held_reason or 'no reason recorded'})"
        )


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
            "presented_token": ctx.fencing_token,
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
