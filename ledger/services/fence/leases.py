"""Run leases: acquire, renew, release, and the reaper that sweeps expired ones.

The fencing token of a run grows on every ownership change (invariant 1): by one, or to the
floor of the fence's generation when that is higher (``ledger.services.fence.generation``:
after a restore, past every token the restored database forgot). Losing a
lease (expiry, takeover of an expired lease, release) turns the run's DISPATCHED operations
UNKNOWN and opens a reconciliation case for each, in the same transaction (invariant 4):
``lease_end.leases_end``. Each grant is an instance of the run, allocated under the
tenant's instance quotas (``ledger.services.lifespan.instances``).
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from ledger.actors import SYSTEM_LIMITS, SYSTEM_REAPER, user_actor, worker_actor
from ledger.boundary import check_text
from ledger.errors import (
    DomainError,
    InvalidInput,
    LeaseHeld,
    LeaseLost,
    NotFound,
    RunCompleted,
    WorkerNotAccepting,
    WrongPhase,
    parse_id,
)
from ledger.models import LeaseGrant, Run, RunLease, Tenant, Worker
from ledger.observability import metrics
from ledger.roles import ADMINISTER
from ledger.services.authority.policy import policy_now
from ledger.services.core.admission import admission_refusal, worker_executing
from ledger.services.core.decisions import acting_name, admin_action_record, decision_reason
from ledger.services.core.fencing import (
    Fenced,
    conflicted,
    fenced,
    lock,
    lock_run,
    run_cancelled,
    runs_locked_for_sweep,
    worker_refused,
)
from ledger.services.evidence.append import ChainBatch
from ledger.services.fence.ending import IN_FLIGHT, TIMEOUT_REASON, runs_cancel
from ledger.services.fence.generation import token_next
from ledger.services.fence.lease_end import leases_end
from ledger.services.lifespan.instances import instance_renewed, instances_admit
from ledger.sql import fence as sql_fence
from ledger.sql import rows as sql_rows
from ledger.states import RUN_ENDING, InstanceState, LeaseEnd, RunStatus, WorkerStatus

MIN_TTL_S = 1
MAX_TTL_S = 3600


def _check_ttl(ttl_s: int) -> None:
    if type(ttl_s) is not int or not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise InvalidInput(f"ttl_s must be an integer from {MIN_TTL_S} to {MAX_TTL_S}")


def _touch(worker: Worker) -> None:
    Worker.objects.filter(pk=worker.pk).update(last_seen_at=timezone.now())


MAX_TOOL_LENGTH = 100


def lease_acquire(*, worker: Worker, run_id: object, owner_id: str, ttl_s: int, tool: str = "") -> RunLease:
    """Take the run's lease if nobody holds it: a new instance of the run, admitted by the
    tenant's instance quotas (403 DENY_QUOTA), for ``tool`` when the worker names one.
    Taking over an expired lease first ends the old ownership (its DISPATCHED operations
    become UNKNOWN, its instance EXPIRED) and then issues the next token (token + 1, or the
    floor of the fence's generation after a restore). A run past its maximum
    runtime times out here instead (409 RUN_CANCELLED)."""
    _check_ttl(ttl_s)
    if not isinstance(tool, str) or len(tool) > MAX_TOOL_LENGTH:
        raise InvalidInput(f"tool must be at most {MAX_TOOL_LENGTH} characters", field="tool")
    if tool:
        check_text(tool, path="tool")  # stored on the instance and in LEASE_ACQUIRED
    if worker.status != WorkerStatus.ACCEPTING:
        raise worker_refused(worker, "takes no new lease")
    not_admitted = admission_refusal(worker)
    if not_admitted is not None:
        raise not_admitted
    refused: DomainError | None = None
    with transaction.atomic():
        # The fence's generation first, shared until the grant commits: a restore moving it
        # waits for this acquisition (and ends its lease), or this one issues under the new.
        generation = sql_fence.fence_generation_shared()
        # The worker row first, then the run (the lock order of worker_quarantine): an
        # acquire racing a quarantine either commits first, and the quarantine then revokes
        # the new lease, or sees the worker no longer ACCEPTING.
        seen = {"id": worker.pk, "status": WorkerStatus.ACCEPTING}
        if not sql_rows.update(Worker, {"last_seen_at": timezone.now()}, **seen):
            raise WorkerNotAccepting("the worker stopped accepting new leases")
        locked = lock(tenant=worker.tenant, run_id=run_id)
        run = locked.run
        policy = policy_now(tenant=worker.tenant, seen=locked.tenant).document
        now = timezone.now()
        if run.status == RunStatus.ACTIVE and run.deadline_at is not None and run.deadline_at <= now:
            batch = ChainBatch(now)
            runs_cancel(runs=[run], batch=batch, actor=SYSTEM_LIMITS, reason=TIMEOUT_REASON, ending=RunStatus.TIMED_OUT)
            batch.commit()  # kept: the refusal below is raised after this commits
        if run.status in RUN_ENDING:
            refused = run_cancelled(run)
        elif run.status != RunStatus.ACTIVE:
            refused = RunCompleted("the run is completed; it takes no new lease")
        elif run.open_conflicts:
            refused = conflicted(run)  # no new owner automates a run a person must decide first
        else:
            takeover = run.lease.owner_id is not None  # _grant refuses a lease still held
            grant = Grant(owner_id=owner_id, ttl_s=ttl_s, tool=tool, generation=generation)
            lease = _grant(run=run, worker=worker, grant=grant, policy=policy, now=now)
    if refused is not None:
        raise refused
    worker_executing(worker)
    metrics.LEASE_ACQUISITIONS.labels(worker.tenant.slug, "takeover" if takeover else "new").inc()
    return lease


@dataclass(frozen=True)
class Grant:
    """What a worker asked for, and the fence's generation it is issued under."""

    owner_id: str
    ttl_s: int
    tool: str
    generation: int


def _grant(*, run: Run, worker: Worker, grant: Grant, policy: dict[str, Any], now: datetime) -> RunLease:
    """Issue the next token on the locked ``run``: a new instance. Allocation (the quota check)
    and the acquisition are one atomic step, so the instance never rests in ALLOCATED: its
    one event, LEASE_ACQUIRED, records both (its tool, the quota use it was admitted at,
    ``instance_state`` RUNNING)."""
    lease = run.lease
    _refuse_if_held(lease, now)
    owner_id, tool = grant.owner_id, grant.tool
    actor = worker_actor(worker, owner_id)
    batch = ChainBatch(now)
    previous_owner = lease.owner_id
    if previous_owner is not None:
        leases_end(runs=[run], batch=batch, actor=actor, end=LeaseEnd.EXPIRED)
    use = instances_admit(run=run, worker=worker, tool=tool, policy=policy)
    previous_fencing_token = lease.fencing_token
    fencing_token = token_next(previous=previous_fencing_token, generation=grant.generation)
    expires_at = now + timedelta(seconds=grant.ttl_s)
    _issue(
        run=run,
        worker=worker,
        owner_id=owner_id,
        tokens=(previous_fencing_token, fencing_token),
        previous_owner=previous_owner,
        tool=tool,
        now=now,
        expires_at=expires_at,
    )
    batch.append(
        run,
        "LEASE_ACQUIRED",
        actor=actor,
        fields={
            "owner_id": owner_id,
            "fencing_token": fencing_token,
            "previous_token": previous_fencing_token,
            "expires_at": expires_at,
            "instance_state": InstanceState.RUNNING.value,
            **({"tool": tool} if tool else {}),
            **({"quota_use": use} if use else {}),
        },
    )
    batch.commit()
    return lease


def _refuse_if_held(lease: RunLease, now: datetime) -> None:
    """LeaseHeld while ``lease`` is owned and unexpired."""
    if lease.owner_id is None:
        return
    # An owned lease has an expiry (the check constraint lease_owned_has_expiry_and_token).
    if lease.expires_at is None:
        raise AssertionError("an owned lease has no expires_at")
    if lease.expires_at > now:
        raise LeaseHeld(f"the lease is held until {lease.expires_at.isoformat()}", expires_at=lease.expires_at)


def _issue(
    *,
    run: Run,
    worker: Worker,
    owner_id: str,
    tokens: tuple[int, int],
    previous_owner: str | None,
    tool: str,
    now: datetime,
    expires_at: datetime,
) -> None:
    """Give the locked ``run``'s lease the second of ``tokens`` (its next token; the first is
    the one it holds) for ``owner_id``:
    the lease row by a conditional UPDATE on the token it held, whose row count decides; the
    history row of the new instance (RUNNING); and the lease in memory."""
    previous_token, fencing_token = tokens
    granted = {
        "owner_id": owner_id,
        "worker_id": worker.pk,
        "fencing_token": fencing_token,
        "acquired_at": now,
        "expires_at": expires_at,
        "last_renewed_at": now,
        "end_reason": None,
        "instance_state": InstanceState.RUNNING,
    }
    if sql_rows.update(RunLease, granted, run_id=run.pk, fencing_token=previous_token) != 1:
        raise LeaseHeld("the lease changed hands concurrently")  # impossible while the row is locked
    sql_rows.insert(
        LeaseGrant(
            run=run,
            tenant_id=run.tenant_id,
            fencing_token=fencing_token,
            owner_id=owner_id,
            worker=worker,
            acquired_at=now,
            previous_owner_id=previous_owner,
            tool=tool,
            state=InstanceState.RUNNING,
            state_changed_at=now,
        )
    )
    lease = run.lease
    lease.owner_id, lease.worker, lease.fencing_token = owner_id, worker, fencing_token
    lease.acquired_at, lease.expires_at, lease.last_renewed_at = now, expires_at, now
    lease.end_reason, lease.instance_state = None, InstanceState.RUNNING


def lease_renew(*, worker: Worker, run_id: object, owner_id: str, fencing_token: int, ttl_s: int) -> RunLease:
    """Extend the lease of its current owner. An expired lease cannot be renewed, and neither
    can the lease of a child run whose parent is no longer ACTIVE (409 RUN_COMPLETED): a
    sub-agent does not outlive the run that started it.

    A worker renews only while it progresses (article "Agent Lifespan Management"): when the
    run has made no progress (``Run.last_progress_at``, or the lease's start) for longer than
    the policy's ``idle_limit_s``, the renewal ends the lease instead, as an expiry (its
    DISPATCHED effects become UNKNOWN with a case), and answers 409 LEASE_LOST ``idle``.

    The renewal is the worker's heartbeat, so it carries the run's news: a cancelled run
    (CANCELLING) still renews during its grace and the caller reads ``lease.run.status``;
    once it has ended, 409 RUN_CANCELLED. Past its maximum runtime, the run times out here.
    The instance turns IDLE when nothing progressed since the last renewal and nothing is
    in flight, RUNNING again once something did."""
    _check_ttl(ttl_s)

    def write(ctx: Fenced) -> RunLease | None:
        idle_limit = policy_now(tenant=worker.tenant, seen=ctx.tenant).document.get("idle_limit_s")
        parent = ctx.run.parent_id
        if parent is not None and not Run.objects.filter(pk=parent, status=RunStatus.ACTIVE).exists():
            raise RunCompleted("the parent run is completed; its child's lease is not renewed")
        if idle_limit is not None and _idle_s(ctx) > idle_limit:
            leases_end(runs=[ctx.run], batch=ctx.batch, actor=ctx.actor, end=LeaseEnd.EXPIRED, reason="idle")
            return None
        return _extend(ctx, ttl_s=ttl_s)

    lease = fenced(
        worker=worker,
        run_id=run_id,
        fencing_token=fencing_token,
        owner_id=owner_id,
        attempted="lease.renew",
        write=write,
        refusal=LeaseLost,
        ending=IN_FLIGHT,
    )
    _touch(worker)
    if lease is None:  # the idle limit ended it; that end is committed
        raise LeaseLost("idle")
    metrics.LEASE_RENEWALS.labels(worker.tenant.slug).inc()
    return lease


def _idle_s(ctx: Fenced) -> float:
    """Seconds since the run last progressed or the lease began, whichever came later."""
    since = max(filter(None, (ctx.run.last_progress_at, ctx.lease.acquired_at)))
    return (ctx.now - since).total_seconds()


def _extend(ctx: Fenced, *, ttl_s: int) -> RunLease:
    """The fenced lease, ``ttl_s`` from now, its instance IDLE or RUNNING again as the run
    progressed since the last renewal, and LEASE_RENEWED."""
    expires_at = ctx.now + timedelta(seconds=ttl_s)
    previous_renewal = ctx.lease.last_renewed_at or ctx.now
    ctx.batch.update(
        RunLease,
        {"expires_at": expires_at, "last_renewed_at": ctx.now},
        where={"run_id": ctx.run.pk, "fencing_token": ctx.fencing_token},
        refusal=lambda: LeaseLost("token_changed"),  # impossible while the row is locked
    )
    ctx.lease.expires_at, ctx.lease.last_renewed_at = expires_at, ctx.now
    moved = instance_renewed(run=ctx.run, lease=ctx.lease, previous_renewal=previous_renewal, batch=ctx.batch)
    ctx.batch.append(
        ctx.run,
        "LEASE_RENEWED",
        actor=ctx.actor,
        fields={
            "fencing_token": ctx.fencing_token,
            "expires_at": expires_at,
            **({"instance_state": moved.value} if moved else {}),
        },
    )
    return ctx.lease


def lease_release(*, worker: Worker, run_id: object, owner_id: str, fencing_token: int) -> RunLease:
    """Give the lease up. Effects dispatched under it and not yet reported become UNKNOWN."""

    def write(ctx: Fenced) -> RunLease:
        leases_end(runs=[ctx.run], batch=ctx.batch, actor=ctx.actor, end=LeaseEnd.RELEASED)
        return ctx.lease

    return fenced(
        worker=worker,
        run_id=run_id,
        fencing_token=fencing_token,
        owner_id=owner_id,
        attempted="lease.release",
        write=write,
        refusal=LeaseLost,
        ending=IN_FLIGHT,
    )


@dataclass(frozen=True)
class ForceRelease:
    """What an admin's force-release ended: the owner and token it took the lease from, and
    how many DISPATCHED operations became UNKNOWN (each with a reconciliation case)."""

    run: Run
    owner_id: str
    fencing_token: int
    operations_unknown: int


FORCE_RELEASE_ACTION = "run.force_release"


def lease_force_release(*, user: Any, run_id: object, fencing_token: int, reason: object) -> ForceRelease:
    """An admin takes the lease away from its holder now: exactly the end a takeover gives
    the old owner (``lease_end.leases_end``: its DISPATCHED operations become UNKNOWN with a
    case each, the approvals asked under its token are void, its instance EXPIRED and its
    resources handed to the reaper), as LEASE_REVOKED naming the admin (the actor) and the
    reason, and an AdminAction of the tenant. The holder's token is stale from the commit
    on: its next write is refused (409 STALE_TOKEN, LEASE_LOST ``revoked`` for a renewal).

    ``fencing_token`` is the token the admin's preview showed: when the lease has changed
    hands since (or ended), nothing is done (409 WRONG_PHASE naming the lease now). 403
    FORBIDDEN without the admin role on the run's tenant; 404 for an unknown run."""
    reason = decision_reason(reason)
    run_uuid = parse_id(run_id, "run")
    tenant = Tenant.objects.filter(runs__pk=run_uuid).first()
    if tenant is None:
        raise NotFound("run not found")
    actor = user_actor(acting_name(user=user, name="", tenant_id=tenant.pk, perm=ADMINISTER))
    with transaction.atomic():
        run = lock_run(tenant=tenant, run_id=run_uuid)
        lease, now = run.lease, timezone.now()
        if lease.owner_id is None:
            raise WrongPhase(
                phase=f"not held ({(lease.end_reason or 'never leased').lower()})",
                wanted="a held lease",
                subject="lease",
            )
        if lease.fencing_token != fencing_token:
            raise WrongPhase(
                phase=f"held under token {lease.fencing_token}",
                wanted=f"token {fencing_token}, the one the preview showed",
                subject="lease",
            )
        owner_id = lease.owner_id
        batch = ChainBatch(now)
        moved = leases_end(
            runs=[run], batch=batch, actor=actor, end=LeaseEnd.REVOKED, reason=f"force-released: {reason}"
        )
        admin_action_record(
            tenant=tenant,
            actor=actor,
            action=FORCE_RELEASE_ACTION,
            subject=str(run.pk),
            reason=reason,
            fields={"owner_id": owner_id, "fencing_token": fencing_token, "operations_unknown": moved},
            now=now,
        )
        batch.commit()
    return ForceRelease(run=run, owner_id=owner_id, fencing_token=fencing_token, operations_unknown=moved)


@dataclass
class ReapResult:
    leases: int = 0
    operations: int = 0
    batches: int = 0


def leases_reap(*, batch_size: int | None = None, progress: Callable[[ReapResult], None] | None = None) -> ReapResult:
    """Sweep expired leases in bounded batches. Each batch claims its runs with
    ``FOR UPDATE SKIP LOCKED``, so two reapers at once split the work instead of doing it
    twice, and an acquire in progress is never waited on."""
    batch_size = batch_size or settings.FENCELINE["REAPER_BATCH_SIZE"]
    result = ReapResult()
    while True:
        with transaction.atomic():
            now = timezone.now()
            runs = runs_locked_for_sweep(expired_by=now, limit=batch_size)
            if not runs:
                break
            batch = ChainBatch(now)
            moved = leases_end(runs=runs, batch=batch, actor=SYSTEM_REAPER, end=LeaseEnd.EXPIRED)
            batch.commit()
        result.leases += len(runs)
        result.operations += moved
        result.batches += 1
        if progress is not None:
            progress(result)
        if len(runs) < batch_size:
            break
    return result
